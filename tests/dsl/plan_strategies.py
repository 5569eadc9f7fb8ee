"""Hypothesis strategies that write syntactically valid ``.plan`` text in varied layouts:
random keys and values of every kind, block order, spacing, newlines, blank lines and comments."""

from hypothesis import strategies as st

from planc.units import UNITS

KEYWORD_KEYS = ["model", "use", "from", "true", "false", "auto", "h", "s", "GiB"]
keys = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), st.sampled_from(KEYWORD_KEYS))

ints = st.integers(-(10**6), 10**12).flatmap(
    lambda n: st.sampled_from([str(n), f"{n:_}"]) if abs(n) >= 1000 else st.just(str(n))
)
floats = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False).map(repr)
exponents = st.tuples(
    st.integers(1, 9), st.sampled_from(["e", "E"]), st.sampled_from(["", "-", "+"]), st.integers(0, 30)
).map(lambda t: f"{t[0]}{t[1]}{t[2]}{t[3]}")
numbers = st.one_of(ints, floats, exponents)
words = st.sampled_from(["gelu", "swiglu", "1f1b", "zero-bubble", "A100-80GB", "synthetic", "x_y", "none"])
string_chars = st.characters(blacklist_characters='"\\\n\r\x00', blacklist_categories=("Cs",))
escapes = st.sampled_from(['\\"', "\\\\", "\\n", "\\t", "\\u00e9", "\\/"])
strings = st.lists(st.one_of(string_chars, escapes), max_size=12).map(lambda parts: '"' + "".join(parts) + '"')
quantities = st.tuples(
    st.integers(0, 10**6).map(str), st.sampled_from(["", " ", "  "]), st.sampled_from(sorted(UNITS))
).map("".join)
scalars = st.one_of(numbers, words, strings, quantities, st.sampled_from(["true", "false", "auto"]))

comment_text = st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=15).map(
    lambda t: "#" + t.rstrip(" \t\f\v\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2028\u2029\u3000")
)
#: What may separate two tokens: spaces, newlines, empty lines, a comment to the end of the line.
separators = st.one_of(
    st.sampled_from([" ", "  ", "\t", "\n", "\n\n", "\n  ", " \n\n  "]),
    comment_text.map(lambda c: f"  {c}\n"),
    comment_text.map(lambda c: f"\n{c}\n"),
)
#: Between a key and '=' only spaces: `8 h\n= 2` would read `8 h` as a quantity.
inline = st.sampled_from([" ", "", "  ", "\t"])


@st.composite
def lists(draw):
    items = draw(st.lists(scalars, max_size=4))
    parts = ["["]
    for index, item in enumerate(items):
        if index:
            parts += [",", draw(separators)]
        parts.append(item)
    if items and draw(st.booleans()):
        parts.append(",")
    parts.append("]")
    return "".join(parts)


@st.composite
def bodies(draw):
    names = draw(st.lists(keys, unique=True, max_size=6))
    parts = ["{", draw(separators)]
    for name in names:
        value = draw(st.one_of(scalars, lists()))
        parts += [name, draw(inline), "=", draw(separators), value, draw(separators)]
    parts.append("}")
    return "".join(parts)


@st.composite
def plan_texts(draw):
    """A whole file: a model block (any of its forms), known and unknown blocks, use blocks."""
    blocks = []
    model = draw(st.sampled_from(["plain", "label", "from", "from-body", "none"]))
    if model == "plain":
        blocks.append("model " + draw(bodies()))
    elif model == "label":
        blocks.append(f"model {draw(strings)} " + draw(bodies()))
    elif model in ("from", "from-body"):
        blocks.append(f"model from {draw(strings)}" + (" " + draw(bodies()) if model == "from-body" else ""))
    for name in draw(st.lists(st.sampled_from(["hardware", "train", "layout", "checkpoint", "extra"]), unique=True)):
        blocks.append(f"{name} " + draw(bodies()))
    for name in draw(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), unique=True, max_size=3)):
        blocks.append(f"use {name}" + (" " + draw(bodies()) if draw(st.booleans()) else ""))
    order = draw(st.permutations(blocks))
    parts = [draw(st.sampled_from(["", "\n", "# header\n\n"]))]
    for block in order:
        parts += [block, draw(separators)]
    return "".join(parts)
