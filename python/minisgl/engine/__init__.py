"""The engine: runs the model on a batch and picks each request's next token. Import from the
modules (``minisgl.engine.sample`` ...)."""
