"""The engine: ``LLMEngine`` (one ``step()`` of the serving loop) and ``LLM`` (offline ``generate``)."""

from paged.engine.llm import LLM
from paged.engine.llm_engine import LLMEngine

__all__ = ["LLM", "LLMEngine"]
