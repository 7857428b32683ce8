"""Grammar-constrained decoding (structured output): a request's grammar (`spec`), compiled
against the model's tokenizer with llguidance (`compiler`), a matcher per sequence
(`matcher`), and the batched token mask the sampler applies to the logits (`mask`)."""
