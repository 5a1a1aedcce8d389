"""Methods to compare: RandOpt and (in later modules) ES, GRPO variants, F-TIS, FGRPO, FERA."""
