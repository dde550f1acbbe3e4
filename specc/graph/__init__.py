"""Small helpers for reading and tidying FX graphs captured by torch.export."""
