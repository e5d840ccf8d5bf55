"""Decoders and language models: answer tokens, generated tokens, and a decoder's rows position by position."""

from lightning_gae.language.answers import AnswerExplanation, NextTokenLogits, answer_rows, explain_answers
from lightning_gae.language.decoder_rows import is_sequence_output, last_positions, sequence_rows
from lightning_gae.language.generation import GenerationExplanation, explain_generation

__all__ = ["AnswerExplanation", "GenerationExplanation", "NextTokenLogits", "answer_rows", "explain_answers",
           "explain_generation", "is_sequence_output", "last_positions", "sequence_rows"]
