"""``math_answer``: final-answer equivalence for math tasks, by value rather than by string.

The answer is taken from the reply (or the ``submit`` argument) in this order:
the last ``\\boxed{...}``, an ``answer is X`` / ``answer: X`` phrase, a GSM8K
``#### X`` line, and finally the last number. It is then compared with the
reference (``task.hidden["answer"]``) exactly for plain numbers (``1,234``,
``$12``, ``18.0`` and ``18`` agree; ``0.333`` is not ``1/3``) and otherwise by
``math-verify`` (LaTeX and sympy equivalence: ``\\frac{1}{2}`` = ``0.5``,
``\\sqrt{18}`` = ``3\\sqrt{2}``).

math-verify bounds its own time with ``signal.alarm``, which exists only in the
main thread; elsewhere its timeouts are off and the answer length cap
(``max_answer_chars``) is what bounds the work.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier

_ANSWER_PHRASE = re.compile(r"(?:final answer|answer)\s*(?:is|:|=)\s*[:\s]*(.+)", re.IGNORECASE)
_HASHES = re.compile(r"####\s*(.+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_PLAIN_NUMBER = re.compile(r"-?(?:\d+(?:,\d{3})*|\d*)(?:\.\d+)?(?:/\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox``), braces balanced; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i]
    return None


def extract_answer(text: str) -> tuple[str | None, str]:
    """``(answer, how)``: the answer string a reply commits to and which rule found it."""
    text = (text or "").strip()
    if not text:
        return None, "empty"
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip(), "boxed"
    for pattern, how in ((_HASHES, "hashes"), (_ANSWER_PHRASE, "phrase")):
        matches = pattern.findall(text)
        if matches:
            answer = matches[-1].strip().splitlines()[0].strip().rstrip(".")
            if answer:
                return answer, how
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1], "last_number"
    return (text, "whole") if len(text) <= 64 else (None, "none")


def _clean(answer: str) -> str:
    answer = answer.strip().strip("$").strip()
    answer = re.sub(r"\\[$%]|\\!|\\,|\\text\{[^}]*\}|\\mathrm\{[^}]*\}", "", answer)
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    answer = re.sub(r"^[A-Za-z ]*=\s*", "", answer)  # "x = 5" -> "5"
    answer = re.sub(r"\s*(?:dollars?|cents?|units?|%|degrees?|meters?|cm|km|kg|hours?|minutes?)\.?$", "", answer)
    return answer.strip().rstrip(".").strip()


def as_number(answer: str) -> Fraction | None:
    """An exact rational for plain numerals (``-1,234.5``, ``3/4``); None for anything symbolic."""
    cleaned = _clean(answer).replace(" ", "")
    if not cleaned or not _PLAIN_NUMBER.fullmatch(cleaned) or not re.search(r"\d", cleaned):
        return None
    try:
        return Fraction(cleaned.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(reference: str, candidate: str) -> bool:
    """True if ``candidate`` has the same value as ``reference`` (exact for numbers, math-verify otherwise)."""
    ref_num, cand_num = as_number(reference), as_number(candidate)
    if ref_num is not None and cand_num is not None:
        return ref_num == cand_num
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None
    config = [LatexExtractionConfig(), ExprExtractionConfig()]

    def parsed(text: str):
        cleaned = _clean(text)
        for form in (f"${cleaned}$", cleaned):
            result = parse(form, extraction_config=config, parsing_timeout=timeout)
            if result:
                return result
        return []

    gold, pred = parsed(reference), parsed(candidate)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


@register_verifier("math_answer")
class MathAnswerVerifier(Verifier):
    """1.0 when the final answer equals ``task.hidden["answer"]`` in value."""

    role = "outcome"
    needs_sandbox = False
    OPTIONS = {"max_answer_chars": 4000}

    def check(self, ctx: VerifyContext) -> Verification:
        reference = str(ctx.task.hidden["answer"])
        reply = (ctx.answer or "")[-self.options["max_answer_chars"] :]
        answer, how = extract_answer(reply)
        details = {"reference": reference, "extracted": answer, "rule": how}
        if answer is None:
            return self.result(0.0, details=details)
        return self.result(float(answers_match(reference, answer)), details=details)
