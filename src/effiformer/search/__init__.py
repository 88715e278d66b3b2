"""Hardware-aware search (HAT, Wang et al. 2020, arXiv 2005.14187): latency datasets measured on
this machine, a latency predictor, evolutionary search under a latency limit; for HAT's
SuperTransformer and for any registered family's own hyper-parameters."""
