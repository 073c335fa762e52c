"""A cap on the digits of a generated JSON number.

A JSON number's grammar admits digits without end, and llguidance has no option to bound
them: a small model under greedy decoding can write ``11.1111...`` until max_tokens. Each
sequence's :class:`NumberCap` follows the JSON lexical state of what the sequence generated
(in a string or not, escapes, and the parts of the number being written) from its tokens'
bytes; once the number's current part holds its cap of digits, the tokens that would add
another digit to it are refused, so the grammar must end the part (``.``, ``e``) or the
number (``,`` ``}`` ``]``, whitespace). Digits inside strings are never capped, nor a
``tool_auto`` text answer that is not JSON.

Which tokens add digits is worked out once per vocabulary (:class:`DigitTokens`): a token
counts by the digits it starts with (``1``, ``12}`` and ``1,"`` all start the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import llguidance
import numpy as np
import numpy.typing as npt

# Caps on a number's parts, in digits. 20 in the integer part: every 64-bit integer, signed
# or not (2**64 has 20 digits). 17 in the fraction: 17 significant digits tell every float64
# apart (its max_digits10), so no float64 needs more. 3 in the exponent: float64's decimal
# exponents run from -324 to 308.
INTEGER_DIGITS = 20
FRACTION_DIGITS = 17
EXPONENT_DIGITS = 3

_DIGITS = b"0123456789"


@dataclass(frozen=True)
class DigitTokens:
    """One vocabulary's tokens as the number cap reads them (built once per tokenizer)."""

    token_bytes: tuple[bytes, ...] = field(repr=False)  # special tokens: b"" (not JSON)
    # how many ASCII digits each token starts with (0 for most), and that as a boolean row
    leading_digits: npt.NDArray[np.int32] = field(repr=False)
    digit_initial: npt.NDArray[np.bool_] = field(repr=False)
    longest: int  # the most digits any token starts with

    @classmethod
    def of(cls, tokenizer: llguidance.LLTokenizer, vocab_size: int) -> DigitTokens:
        """Read from llguidance's vocabulary, padded or cut to ``vocab_size`` rows (the
        width of the masks)."""
        count = min(vocab_size, tokenizer.vocab_size)
        token_bytes = tuple(
            b"" if tokenizer.is_special_token(i) else tokenizer.decode_bytes([i])
            for i in range(count)
        ) + (b"",) * (vocab_size - count)
        leading = np.fromiter(
            (len(b) - len(b.lstrip(_DIGITS)) for b in token_bytes),
            dtype=np.int32,
            count=vocab_size,
        )
        return cls(token_bytes, leading, leading > 0, int(leading.max(initial=0)))


_Part = Literal["integer", "fraction", "exponent"]
_CAPS: dict[_Part, int] = {
    "integer": INTEGER_DIGITS,
    "fraction": FRACTION_DIGITS,
    "exponent": EXPONENT_DIGITS,
}


class NumberCap:
    """One sequence's JSON lexical state, enough to cap its numbers' digits.

    ``free_text_unless_call``: the output is ``tool_auto``'s text-or-call, where a text
    answer is not JSON: the first byte decides (``<`` begins a call, whose text is lexed as
    JSON; anything else is text, never capped). Otherwise the whole output is lexed as JSON
    (a tool call's ``<tool_call>`` and ``</tool_call>`` hold no digits and no quotes).
    """

    def __init__(self, tokens: DigitTokens, *, free_text_unless_call: bool = False) -> None:
        self._tokens = tokens
        self._undecided = free_text_unless_call  # waiting for the first byte
        self._off = False  # free text: nothing is capped
        self._in_string = False
        self._escaped = False  # the previous byte in a string was an unescaped backslash
        self._part: _Part | None = None  # the number part being written, if any
        self._digits = 0  # digits in that part so far

    def consume(self, token: int) -> None:
        """Follow one consumed token's bytes."""
        if self._off or not 0 <= token < len(self._tokens.token_bytes):
            return
        data = self._tokens.token_bytes[token]
        if self._undecided and data:
            self._undecided = False
            if data[0] != 0x3C:  # not "<": a text answer
                self._off = True
                return
        for byte in data:
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif byte == 0x5C:  # backslash
                    self._escaped = True
                elif byte == 0x22:  # closing quote
                    self._in_string = False
            elif 0x30 <= byte <= 0x39:
                if self._part is None:
                    self._part, self._digits = "integer", 1
                else:
                    self._digits += 1
            elif byte == 0x2D and self._part is None:  # "-": a number begins
                self._part, self._digits = "integer", 0
            elif byte == 0x2E and self._part == "integer":  # "."
                self._part, self._digits = "fraction", 0
            elif byte in (0x65, 0x45) and self._part in ("integer", "fraction"):  # e E
                self._part, self._digits = "exponent", 0
            elif byte in (0x2B, 0x2D) and self._part == "exponent" and self._digits == 0:
                pass  # the exponent's sign
            else:
                self._part = None
                if byte == 0x22:
                    self._in_string = True

    def digits_left(self) -> int | None:
        """How many more digits the number's current part may take; None outside a number."""
        if self._part is None:
            return None
        return _CAPS[self._part] - self._digits

    def restrict(self, allowed: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        """``allowed`` without the tokens that would take the current number part past its
        cap (``allowed`` itself, untouched, when no cap applies or when nothing would be
        left: the grammar needs the digits, e.g. for a schema's minimum)."""
        left = self.digits_left()
        if left is None or left >= self._tokens.longest:
            return allowed
        too_long = self._tokens.digit_initial if left <= 0 else self._tokens.leading_digits > left
        capped = allowed & ~too_long[: allowed.shape[0]]
        return capped if capped.any() else allowed
