"""Stop strings (trtcore.runtime.stop and LLM.generate / LLM.stream), against vLLM's
documented semantics: the earliest stop string ends the text right before it, the stop
string is not in the output, ``stop_reason`` is the string, no match until more than
``min_tokens`` tokens; a stream never shows a piece of a stop string that later completes.

The reference here is a brute-force one written for the test: the final text is the
generated text cut at the first occurrence of any stop string (searched only in text that
appeared after ``min_tokens`` tokens).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hf_models import VARIANTS, hf_models  # noqa: F401  (fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

from trtcore import LLM, SamplingParams
from trtcore.errors import InvalidRequestError
from trtcore.runtime.stop import StopStringMatcher


def _stream(pieces: list[str], stop: list[str], min_tokens: int = 0, include: bool = False) -> tuple[list[str], str | None, int]:
    """Feed the token texts one by one; return the deltas, the match and the tokens consumed."""
    m = StopStringMatcher(stop, min_tokens, include)
    text, deltas = "", []
    for n, piece in enumerate(pieces, start=1):
        text += piece
        delta, hit = m.update(text, n, final=n == len(pieces))
        deltas.append(delta)
        assert m.shown == "".join(deltas)
        if hit is not None:
            return deltas, hit, n
    return deltas, None, len(pieces)


def _reference(pieces: list[str], stop: list[str], min_tokens: int) -> tuple[str, str | None, int]:
    """Brute force: after each token, the earliest stop occurrence that ends in text not yet
    searched... simplest complete form: the first token count n > min_tokens at which the
    text contains a stop string starting at or after the text of the first min_tokens tokens."""
    text = ""
    for n, piece in enumerate(pieces, start=1):
        text += piece
        if n > min_tokens:
            found = [(text.find(s), k) for k, s in enumerate(stop) if text.find(s) >= 0]
            if found:
                idx, k = min(found)
                return text[:idx], stop[k], n
    return text, None, len(pieces)


def test_stop_string_cut_and_reason() -> None:
    deltas, hit, n = _stream(["Hel", "lo wo", "rld!", " more"], ["wor"])
    assert "".join(deltas) == "Hello " and hit == "wor" and n == 3


def test_include_stop_str_in_output_ends_the_text_with_it() -> None:
    """vLLM's ``include_stop_str_in_output``: the text up to and with the matched string; the
    text after it in the same token is still cut; the match and the token count are the same."""
    deltas, hit, n = _stream(["Hel", "lo wo", "rld!", " more"], ["wor"], include=True)
    assert "".join(deltas) == "Hello wor" and hit == "wor" and n == 3
    assert SamplingParams(stop="x", include_stop_str_in_output=True).include_stop_str_in_output is True
    with pytest.raises(InvalidRequestError, match="include_stop_str_in_output"):
        SamplingParams(include_stop_str_in_output="yes")  # type: ignore[arg-type]


def test_earliest_match_wins_then_list_order() -> None:
    assert _stream(["abcdef"], ["de", "bc"])[1] == "bc"
    assert _stream(["abcdef"], ["bcd", "bc"])[1] == "bcd"  # same start: the one listed first


def test_partial_stop_is_held_back_then_released() -> None:
    deltas, hit, _ = _stream(["x", "<", "/", "a", "b"], ["</s>"])
    assert hit is None
    assert deltas == ["x", "", "", "</a", "b"]  # "<" and "</" could start "</s>"


def test_held_text_is_released_on_the_last_token() -> None:
    deltas, hit, _ = _stream(["x", "</"], ["</s>"])
    assert hit is None and "".join(deltas) == "x</"


def test_min_tokens_delays_matching() -> None:
    deltas, hit, n = _stream(["a", "STOP", "b", "STOP", "c"], ["STOP"], min_tokens=2)
    assert hit == "STOP" and n == 4 and "".join(deltas) == "aSTOPb"


def test_stop_string_validation() -> None:
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams().stop == []
    for bad in ["", ["a", ""], [1], b"x"]:
        with pytest.raises(InvalidRequestError, match="SamplingParams.stop must be"):
            SamplingParams(stop=bad)
    with pytest.raises(InvalidRequestError):
        StopStringMatcher([""])


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="ab<>/", min_size=0, max_size=3), min_size=1, max_size=12),
    stop=st.lists(st.text(alphabet="ab<>/", min_size=1, max_size=4), min_size=1, max_size=3),
    min_tokens=st.integers(0, 3),
)
def test_matcher_equals_brute_force_and_never_shows_a_stop_piece(pieces, stop, min_tokens) -> None:
    deltas, hit, n = _stream(pieces, stop, min_tokens)
    want_text, want_hit, want_n = _reference(pieces, stop, min_tokens)
    shown = "".join(deltas)
    if min_tokens == 0:
        assert (shown, hit, n) == (want_text, want_hit, want_n)
    else:  # text from the first min_tokens tokens may be shown; the cut is never before it
        assert hit is None or n >= want_n
    if hit is not None:
        # the shown text (at every moment a prefix of the final one) holds no piece of the
        # stop string that completed: the match starts right where it ends
        full = "".join(pieces[:n])
        assert full.startswith(shown) and full[len(shown) :].startswith(hit)


# --- end to end on the reference backend -------------------------------------------------------


@pytest.fixture(scope="module")
def char_llm(hf_models, tmp_path_factory):  # noqa: F811
    """A tiny model with a character-level tokenizer (ids 3.. decode to one character each)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    d = hf_models.dir("llama3_rope")
    tok_dir = tmp_path_factory.mktemp("chars") / "m"
    shutil.copytree(d, tok_dir)
    vocab = {f"<{i}>" if i < 3 else chr(0x21 + i): i for i in range(VARIANTS["llama3_rope"].vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()  # no spaces between tokens
    tok.save(str(tok_dir / "tokenizer.json"))
    return LLM(tok_dir, backend="reference", kv_cache="paged", progress=False)


def test_generate_and_stream_stop_at_a_stop_string(char_llm) -> None:
    prompt = [5, 6, 7]
    base = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    [full] = char_llm.generate([prompt], base)
    text = full.outputs[0].text
    assert len(text) == 12
    stop = text[5:7]  # completes with the 7th token (or earlier, if it occurs before)
    first = text.find(stop)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop, "\u2603"])
    [got] = char_llm.generate([prompt], params)
    comp = got.outputs[0]
    assert comp.text == text[:first] and comp.finish_reason == "stop" and comp.stop_reason == stop
    assert comp.token_ids == full.outputs[0].token_ids[: first + len(stop)]
    pieces = list(char_llm.stream([prompt, prompt], [params, base]))
    mine = [p for p in pieces if p.index == 0]
    assert "".join(p.text for p in mine) == text[:first]
    assert mine[-1].finish_reason == "stop" and mine[-1].stop_reason == stop
    assert all(p.finish_reason is None for p in mine[:-1]) and len(mine) == first + len(stop)
    other = [p for p in pieces if p.index == 1]  # the other request runs to its end
    assert "".join(p.text for p in other) == text and other[-1].finish_reason == "length"


def test_online_step_stops_at_a_stop_string(char_llm) -> None:
    prompt = [9, 10]
    [full] = char_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    text = full.outputs[0].text
    stop = text[3]
    rid = char_llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop=stop))
    outs = []
    while char_llm.has_unfinished_requests():
        outs += [o for o in char_llm.step() if o.index == rid]
    assert "".join(o.text for o in outs) == text[: text.find(stop)]
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == stop
    assert np.all([o.finish_reason is None for o in outs[:-1]])


def test_stop_token_ids_outside_the_vocabulary_are_refused_and_the_llm_goes_on(char_llm) -> None:
    """An id the model cannot sample never stops it; one past int64 (with ``min_tokens``, so that
    it is banned) broke the sampler for every request after it (a reviewing helper's find, through
    the server): refused at admission, naming the field, and the next request runs."""
    from trtcore.errors import InvalidRequestError

    vocab = char_llm.config.vocab_size
    for ids in ([vocab], [3, 2**63]):
        with pytest.raises(InvalidRequestError, match=rf"stop_token_ids has ids outside the vocabulary \[0, {vocab}\)"):
            char_llm.generate([5, 6], SamplingParams(temperature=0, max_tokens=4, min_tokens=2, stop_token_ids=ids))
    # in a list: that request's output carries the error, the others run
    bad, ok = char_llm.generate([[5, 6], [5, 6]], [SamplingParams(max_tokens=4, stop_token_ids=[vocab]), SamplingParams(temperature=0, max_tokens=4)])
    assert isinstance(bad.error, InvalidRequestError) and bad.outputs[0].finish_reason == "error"
    assert ok.error is None and len(ok.outputs[0].token_ids) >= 1
