"""CoRP consolidation: fold a rewarded population into one gated model (see corp_operator.py)."""
