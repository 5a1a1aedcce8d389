"""The bench's report: results.csv, table.md, plots, and the sections documents take from them, in files by
job: `rows.py` (numbers), `tables.py`, `prose.py` (sentences), `plots.py`, `write.py` (the files),
`sections.py` (the README's results section, docs/bench.md's protocol tables).

Statistics: per (task, setting, budget, row) the mean and sample standard deviation of test
accuracy across seeds; each configured comparison pairs the two rows' per-example outcomes on the
same test examples in every seed (`corp.algorithms.stats.compare_paired_seeds`: the across-seed 95% interval,
a t interval over the seeds' mean paired differences with k - 1 df plus the test examples' sampling
term, and per seed the difference with its within-seed paired interval and the sign count). A
sentence that says one row beats another is written only when the across-seed interval excludes
zero; it cites the interval and both sides' FLOPs.
"""

from corp.bench.report.prose import beats_sentences, reading_lines, regime_text
from corp.bench.report.rows import LABEL_PRIOR, comparisons, flat_rows, label_prior_rows, trial_flops
from corp.bench.report.sections import protocol_section, readme_section, write_into
from corp.bench.report.tables import comparisons_table, headline_table, table_md, time_table
from corp.bench.report.write import write_outputs

__all__ = [
    "LABEL_PRIOR",
    "beats_sentences",
    "comparisons",
    "comparisons_table",
    "flat_rows",
    "headline_table",
    "label_prior_rows",
    "protocol_section",
    "reading_lines",
    "readme_section",
    "regime_text",
    "table_md",
    "time_table",
    "trial_flops",
    "write_into",
    "write_outputs",
]
