"""Model specs the `--model` flag accepts besides a local Hugging Face directory (no torch here)."""

DUMMY = "dummy"
SMOLLM2 = "smollm2"
BUILTIN_MODELS = (DUMMY, SMOLLM2)
