"""A chat: templates, history and the context's fit."""
