"""Model specs the `--model` flag accepts besides a local Hugging Face directory (no torch here)."""

DUMMY = "dummy"
NULL = "null"  # the dummy's tokenizer and shape, no forward pass: measures everything but the model
SMOLLM2 = "smollm2"
BUILTIN_MODELS = (DUMMY, NULL, SMOLLM2)
