"""minisgl: a small, readable LLM inference engine in SGLang's style, built chapter by chapter."""
