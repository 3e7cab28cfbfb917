"""Models for a job: loading (embedded / GGUF / dir / hub id), W8A16 copies, shape-only models, the pair."""
