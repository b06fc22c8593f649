"""Renderers: findings and summaries to text, markdown and JSON."""
