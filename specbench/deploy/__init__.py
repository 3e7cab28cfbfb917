"""Deployment answers: a γ schedule per batch size (speculation off included) and engine configs that apply it."""
