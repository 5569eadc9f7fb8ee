"""The grammar and the syntax tree: rule coverage, positions, literals, comments, hostile input."""

import dataclasses

import pytest
from lark import Token, Tree

from planc.dsl import ast, parse
from planc.dsl.parser import ToAst, lark_parser
from planc.errors import PlanError, PlanErrors

from .helpers import EXAMPLE_PLANS

EVERYTHING = """
# every construct of the language
model "tiny" { layers = 4  hidden = 1_024 }
use foo
use bar { flag = true  off = false  mode = auto  names = [a, "b", 3, 80 GiB, 1f1b,]  empty = [] }
hardware { device = "cpu"  memory = 80 GiB  net = 200Gb/s  peak = 312 TFLOPS }
train { lr = 3e-4  big = 1e3  f = 1.5e3  neg = -3  sched = zero-bubble  data = synthetic }
"""
#: The other form of the model block (a plan has one model block).
MODEL_FROM = 'model from "configs/x/config.json" { seq_len = 2_048 }\nmodel from "c.json"\n'


def tree_names() -> set[str]:
    """Every tree name the parser can produce: rule names and aliases, minus inlined rules."""
    names = set()
    for rule in lark_parser().rules:
        if rule.alias:
            names.add(rule.alias)
        elif rule.origin.name.startswith("_") or (rule.options.expand1 and len(rule.expansion) == 1):
            continue
        else:
            names.add(rule.origin.name)
    return names


def test_every_grammar_rule_has_a_node_class():
    names = tree_names()
    assert names == set(ast.RULE_NODES), "grammar rules and ast.RULE_NODES disagree"
    for name in names:
        assert callable(getattr(ToAst, name, None)), f"ToAst has no method for rule {name!r}"


def test_the_example_sources_use_every_rule():
    used = {
        subtree.data for source in (EVERYTHING, MODEL_FROM) for subtree in lark_parser().parse(source).iter_subtrees()
    }
    assert used == tree_names()


def _no_lark_objects(root):
    for item in ast.walk(root):
        assert not isinstance(item, (Tree, Token)), f"a raw lark {type(item).__name__} survived: {item!r}"
        if isinstance(item, ast.Node):
            assert item.line >= 1 and item.column >= 1
            assert (item.end_line, item.end_column) >= (item.line, item.column)


@pytest.mark.parametrize(
    "source",
    [EVERYTHING, MODEL_FROM.split("\n")[0]] + [p.read_text() for p in EXAMPLE_PLANS],
    ids=["everything", "model-from"] + [p.stem for p in EXAMPLE_PLANS],
)
def test_transform_is_total(source):
    _no_lark_objects(parse(source, "x.plan"))


def test_values_and_positions():
    plan = parse(EVERYTHING, "x.plan")
    blocks = {b.name if not isinstance(b, ast.UseBlock) else f"use {b.strategy.text}": b for b in plan.blocks}
    bar = {e.key.text: e.value for e in blocks["use bar"].entries}
    assert bar["flag"] == ast.Bool(value=True, line=5, column=18, end_line=5, end_column=22)
    assert isinstance(bar["mode"], ast.Auto)
    names = bar["names"]
    assert isinstance(names, ast.ListValue) and [type(i).__name__ for i in names.items] == [
        "Word",
        "String",
        "Number",
        "Quantity",
        "Word",
    ]
    assert bar["empty"].items == ()
    hw = {e.key.text: e.value for e in blocks["hardware"].entries}
    assert (hw["memory"].number, hw["memory"].unit, hw["memory"].raw) == (80, "GiB", "80 GiB")
    assert (hw["net"].number, hw["net"].unit, hw["net"].raw) == (200, "Gb/s", "200 Gb/s")
    train = {e.key.text: e.value for e in blocks["train"].entries}
    assert train["lr"].value == pytest.approx(3e-4) and isinstance(train["lr"].value, float)
    assert train["big"].value == 1000 and isinstance(train["big"].value, int)  # no '.', integral
    assert train["f"].value == 1500.0 and isinstance(train["f"].value, float)  # written with '.'
    assert train["neg"].value == -3
    assert train["sched"] == ast.Word(value="zero-bubble", line=7, column=60, end_line=7, end_column=71)
    model = blocks["model"]
    assert model.label.value == "tiny"
    assert {e.key.text: e.value.value for e in model.entries} == {"layers": 4, "hidden": 1024}


def test_model_from_and_use_without_body():
    plan = parse('model from "c.json"\nuse foo\n', "x.plan")
    model, use = plan.blocks
    assert model.source.value == "c.json" and model.body is None and model.entries == ()
    assert use.strategy.text == "foo" and use.body is None


def test_newlines_and_spaces_separate_entries_alike():
    one_line = parse('model { preset = "llama3-8b"  seq_len = 4096 }', "x")
    many = parse('model {\n  preset = "llama3-8b"\n  seq_len = 4096\n}\n', "x")
    values = lambda p: [(e.key.text, e.value.raw) for e in p.blocks[0].entries]  # noqa: E731
    assert values(one_line) == values(many) == [("preset", '"llama3-8b"'), ("seq_len", "4096")]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_every_kind_of_line_end_ends_a_comment(newline):
    # A CR-only file (classic Mac) once let the first '#' comment swallow the rest of the file.
    text = newline.join(["model {  # the model", '  preset = "gpt2"', "  seq_len = 512 # short", "}", ""])
    (block,) = parse(text, "x").blocks
    assert [(e.key.text, e.key.line) for e in block.entries] == [("preset", 2), ("seq_len", 3)]


def test_a_key_after_a_number_is_not_read_as_a_unit():
    # `8 h` is 8 hours, but in `nodes = 8 h = 2` (or before a key like `min_lr`) it is not.
    plan = parse("train { steps = 8 min_lr = 0 }\nhardware { nodes = 8 s = 2 }", "x")
    assert [(e.key.text, type(e.value).__name__) for b in plan.blocks for e in b.entries] == [
        ("steps", "Number"),
        ("min_lr", "Number"),
        ("nodes", "Number"),
        ("s", "Number"),
    ]


@pytest.mark.parametrize("word", ["1f1b", "zero-bubble", "gelu", "A100-80GB", "_x", "e3"])
def test_bare_words(word):
    (entry,) = parse(f"layout {{ schedule = {word} }}", "x").blocks[0].entries
    assert entry.value == ast.Word(value=word, line=1, column=21, end_line=1, end_column=21 + len(word))


@pytest.mark.parametrize(
    "text,value",
    [
        ("1_000", 1000),
        ("1e3", 1000),
        ("10e-1", 1),
        ("1.0", 1.0),
        ("2.5e-3", 0.0025),
        ("-7", -7),
        ("+3", 3),
        ("0", 0),
        ("1_000.000_1", 1000.0001),
        ("123456789012345678901234567890", 123456789012345678901234567890),
    ],
)
def test_numbers(text, value):
    (entry,) = parse(f"train {{ x = {text} }}", "x").blocks[0].entries
    assert entry.value.value == value and type(entry.value.value) is type(value) and entry.value.raw == text


@pytest.mark.parametrize(
    "raw,value",
    [
        (r'"plain"', "plain"),
        (r'"a\"b"', 'a"b'),
        (r'"back\\slash"', "back\\slash"),
        (r'"t\tn\n"', "t\tn\n"),
        (r'"\u00e9t\u00E9"', "été"),
        (r'"a/b"', "a/b"),
        (r'"é # not a comment"', "é # not a comment"),
    ],
)
def test_strings(raw, value):
    (entry,) = parse(f"train {{ data = {raw} }}", "x").blocks[0].entries
    assert entry.value.value == value and entry.value.raw == raw


def test_every_unit_of_the_unit_table_parses():
    from planc.units import UNITS

    for unit in UNITS:
        (entry,) = parse(f"hardware {{ x = 2 {unit} }}", "x").blocks[0].entries
        assert isinstance(entry.value, ast.Quantity) and entry.value.unit == unit, unit


def test_literal_errors_are_all_reported_together():
    with pytest.raises(PlanErrors) as caught:
        parse('train { a = 80 GIB  b = 1.2.3  c = "x\\q" }', "x.plan")
    assert [(e.location.line, e.location.col, e.message) for e in caught.value.errors] == [
        (1, 16, "unknown unit 'GIB'"),
        (1, 25, "'1.2.3' is not a valid number"),
        (1, 38, "unknown escape sequence '\\q' in a string"),
    ]


def test_comments_are_kept_and_attached():
    source = (
        "# file header\n"
        "\n"
        "# about the model\n"
        "model {  # header comment\n"
        "  # above layers\n"
        "  layers = 4  # four\n"
        "\n"
        "  hidden = 8\n"
        "  # closing\n"
        "}  # after the brace\n"
        "# at the end\n"
    )
    plan = parse(source, "x")
    (model,) = plan.blocks
    text = lambda cs: [c.text for c in cs]  # noqa: E731
    assert text(plan.header) == ["# file header"]
    assert text(model.leading) == ["# about the model"]
    assert model.header_comment.text == "# header comment"
    layers, hidden = model.entries
    assert text(layers.leading) == ["# above layers"] and layers.trailing.text == "# four"
    assert hidden.blank_before and not layers.blank_before
    assert text(model.body.closing) == ["# closing"]
    assert model.trailing.text == "# after the brace"
    assert text(plan.trailing) == ["# at the end"]


def test_no_comment_is_lost_in_odd_places():
    source = "model # a\n{ x = [1,  # b\n 2]  # c\n}\nuse foo  # d\nhardware { a = 1 } # e\n# f\ntrain { # g\n}"
    plan = parse(source, "x")
    found = sorted(item.text for item in ast.walk(plan) if isinstance(item, ast.Comment))
    assert found == ["# a", "# b", "# c", "# d", "# e", "# f", "# g"]


@pytest.mark.parametrize(
    "junk",
    ["[" * 100_000, "{" * 100_000, "model { a = " + "[" * 100_000, "model {" * 50_000, "}" * 100_000, '"' * 100_001],
)
def test_deep_nesting_and_long_runs_give_a_plan_error(junk):
    with pytest.raises(PlanError) as caught:
        parse(junk, "x.plan")
    assert str(caught.value).startswith("x.plan:1:")


def test_a_file_of_comments_is_an_empty_plan():
    plan = parse("#" * 100_000 + "\n# more\n", "x.plan")
    assert plan.blocks == () and len(plan.trailing) == 2


def test_nodes_are_frozen():
    plan = parse(EVERYTHING, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.blocks[0].line = 3  # type: ignore[misc]
