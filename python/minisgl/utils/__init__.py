"""Small helpers the whole engine shares; import each from its own module (``utils.misc`` ...)."""
