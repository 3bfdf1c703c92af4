"""What the bundled model answers the France chat question, greedy, in the mode the tests run.

The first answer token is a near-tie (" The" / "L", about 0.35 apart in llama.cpp's logits).
The CPU runtime's default activations (gpu/ops/cpu_features.py: int16, the accuracy rule's
pick) and the float kernels keep the F32 model's answer, "The capital of France is Paris.",
which ends the turn. The opt-in int8 activations take llama.cpp's side: "L'Étoile, la Mars…",
which runs on without ending the turn; its continuation is itself a chain of near-ties, so
tests check how an answer begins, not its whole text.

The plain completion prompt "The capital of France is" continues " Paris." in every mode.
"""
from __future__ import annotations

from zerolayer.gpu.ops import cpu_features

FRANCE_QUESTION = "What is the capital of France?"
# int8 activations anywhere in the stack flip the first token
_INT8 = cpu_features.ISA != 0 and cpu_features.ACTIVATIONS != "int16"
FRANCE_ANSWER = "L'Étoile" if _INT8 else "Paris"  # what the answer begins with / names
FRANCE_ENDS_TURN = not _INT8  # does the greedy answer end the turn (within 16 tokens)?

