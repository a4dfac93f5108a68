"""Unit tests of gradstop, the book's helper package (src/gradstop/)."""

import ast
import base64
import html
import re
import shutil
from pathlib import Path

import nbformat
import pytest
import torch

import gradstop as gp
from gradstop import forward, graph

# --- backward graphs -----------------------------------------------------------


def small_graph():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * x.sigmoid()
    return x, y.sum()


def svg_texts(svg: str) -> list[str]:
    """The text lines of an SVG picture, as a reader sees them."""
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]


def test_two_renders_are_byte_identical():
    # Separate computations: every tensor and grad_fn has a new id() the second time.
    first = gp.backward_graph(small_graph()[1], alt="graph").svg
    second = gp.backward_graph(small_graph()[1], alt="graph").svg
    assert first == second


def test_no_object_ids_leak_into_the_svg():
    svg = gp.backward_graph(small_graph()[1], alt="graph").svg
    assert not re.search(r"\d{9,}", svg), "a Python id() survived the renaming"
    assert "SigmoidBackward0" in svg and "MulBackward0" in svg and "SumBackward0" in svg


def test_names_label_the_leaves():
    x, out = small_graph()
    assert "x" in svg_texts(gp.backward_graph(out, alt="graph", names={"x": x}).svg)


def test_output_is_named_by_names_by_the_callers_variable_or_as_output():
    x, loss = small_graph()
    assert "loss" in svg_texts(gp.backward_graph(loss, alt="graph").svg)
    assert "total" in svg_texts(gp.backward_graph(loss, alt="graph", names={"total": loss}).svg)
    assert "output" in svg_texts(gp.backward_graph(x.exp().sum(), alt="graph").svg)


def test_a_named_computed_tensor_names_the_node_that_made_it():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    z1 = x + 1.0
    loss = (z1 * 2).sum()
    texts = svg_texts(gp.backward_graph(loss, alt="graph", names={"z1 = f(x)": z1}).svg)
    at = texts.index("z1 = f(x)")
    assert texts[at - 1] == "AddBackward0"
    unrelated = x.exp()  # not in loss's graph: named, but not drawn
    with_unrelated = gp.backward_graph(loss, alt="graph", names={"other": unrelated}).svg
    assert "other" not in svg_texts(with_unrelated)


def test_both_kinds_of_picture_write_shapes_the_same_way():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = torch.ones(2, 3, requires_grad=True)
    with gp.record() as rec:
        y = (w * x).sum()
    backward = svg_texts(gp.backward_graph(y, alt="graph", names={"x": x, "w": w}).svg)
    forward_texts = svg_texts(gp.forward_view(rec, y, alt="view").svg)
    for shape in ("(3,)", "(2, 3)", "()"):
        assert shape in backward and shape in forward_texts
    assert not any(re.fullmatch(r" ?\(\d+\)", t) for t in backward + forward_texts)


def test_renders_as_figure_with_alt_and_caption():
    pic = gp.backward_graph(small_graph()[1], alt='x "squashed" & summed', caption="The `y` graph")
    shown = pic._repr_html_()
    assert 'alt="x &quot;squashed&quot; &amp; summed"' in shown
    assert "<figcaption>The <code>y</code> graph</figcaption>" in shown
    encoded = re.search(r'base64,([^"]+)"', shown).group(1)
    assert base64.b64decode(encoded).decode() == pic.svg


def test_draws_after_backward():
    x, out = small_graph()
    before = gp.backward_graph(out, alt="graph").svg
    out.backward()
    assert gp.backward_graph(out, alt="graph").svg == before


def test_freed_graph_with_saved_tensors_is_a_clear_error():
    _, out = small_graph()
    gp.backward_graph(out, alt="graph", show_saved=True)  # fine before backward
    out.backward()
    with pytest.raises(ValueError, match="already freed.*retain_graph=True"):
        gp.backward_graph(out, alt="graph", show_saved=True)


def test_not_a_tensor_is_a_type_error():
    with pytest.raises(TypeError, match="expected the tensor whose graph to draw, got list"):
        gp.backward_graph([1, 2], alt="graph")


def test_tensor_without_graph_is_a_value_error():
    with pytest.raises(ValueError, match="no autograd graph.*detach"):
        gp.backward_graph(torch.ones(3).detach(), alt="graph")


def test_alt_text_is_required():
    with pytest.raises(ValueError, match="alt text is required"):
        gp.backward_graph(small_graph()[1], alt="  ")


def test_names_must_be_tensors():
    with pytest.raises(TypeError, match="not tensors: \\['x'\\]"):
        gp.backward_graph(small_graph()[1], alt="graph", names={"x": 3})


def test_side_by_side_shows_both_with_captions():
    left = gp.backward_graph(small_graph()[1], alt="left graph", caption="without detach")
    right = gp.backward_graph(small_graph()[1], alt="right graph", caption="with `z.detach()`")
    shown = gp.side_by_side(left, right, caption="SigmoidBackward0 vanished")._repr_html_()
    assert shown.count("<img") == 2
    assert "without detach" in shown and "<code>z.detach()</code>" in shown
    assert "SigmoidBackward0 vanished" in shown


def test_side_by_side_rejects_bad_input():
    pic = gp.backward_graph(small_graph()[1], alt="graph", caption="a")
    with pytest.raises(TypeError, match="must be a Picture"):
        gp.side_by_side(pic, "not a picture", caption="c")
    with pytest.raises(ValueError, match="needs its own caption"):
        gp.side_by_side(pic, gp.backward_graph(small_graph()[1], alt="graph"), caption="c")
    with pytest.raises(ValueError, match="pair needs a caption"):
        gp.side_by_side(pic, pic, caption="")


def edge_paths(svg: str) -> dict[str, str]:
    """Each drawn edge's <g> element, by its title ("n4->n2")."""
    groups = re.findall(r'<g id="edge\d+" class="edge">(.*?)</g>', svg, re.S)
    return {html.unescape(re.search(r"<title>(.*?)</title>", g).group(1)): g for g in groups}


def test_cut_edges_are_drawn_red_and_dashed_and_only_they():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    z = x + 1.0
    loss = (z * 3 * z).sum()  # z reaches the second product twice: directly and via *3
    direct = [e for e in gp.backward_edges(loss) if e.source is z.grad_fn]
    direct = [e for e in direct if e.target is loss.grad_fn.next_functions[0][0]]
    assert len(direct) == 1
    plain = gp.backward_graph(loss, alt="graph", names={"z": z})
    cut = gp.backward_graph(loss, alt="graph", names={"z": z}, cut_edges=direct, cut_label="cut")
    red = [t for t, g in edge_paths(cut.svg).items() if gp.palette.RED in g]
    assert len(red) == 1 and "stroke-dasharray" in edge_paths(cut.svg)[red[0]]
    assert "cut" in svg_texts(cut.svg) and "cut" not in svg_texts(plain.svg)
    assert edge_paths(plain.svg).keys() == edge_paths(cut.svg).keys()  # same edges, restyled
    assert not any(gp.palette.RED in g for g in edge_paths(plain.svg).values())


def test_a_cut_edge_from_another_graph_is_refused():
    _, out = small_graph()
    _, other = small_graph()
    with pytest.raises(ValueError, match="cut_edges must be edges of this graph"):
        gp.backward_graph(out, alt="graph", cut_edges=gp.backward_edges(other)[:1])


def test_side_by_side_at_one_scale_shares_the_row_by_width():
    small = gp.backward_graph(small_graph()[1], alt="small", caption="small")
    x = torch.ones(2, requires_grad=True)
    wide = gp.backward_graph(x.sin() + x.cos() + x.exp(), alt="wide", caption="wide")
    widths = [gp.pictures.svg_width(p.svg) for p in (small, wide)]
    assert widths[0] < widths[1]
    shown = gp.side_by_side(small, wide, caption="c", same_scale=True)._repr_html_()
    grows = [float(g) for g in re.findall(r"flex:([\d.]+) 1 0", shown)]
    assert grows == pytest.approx(widths)  # each picture's share is its own width
    assert shown.count("width:100%;box-sizing:border-box") == 2
    assert f"max-width:calc({sum(widths):g}pt + 1.5em)" in shown  # never blown up
    default = gp.side_by_side(small, wide, caption="c")._repr_html_()
    assert re.findall(r"flex:([\d.]+) 1 0", default) == ["1", "1"]  # as before
    with pytest.raises(ValueError, match="no width in points"):
        gp.pictures.svg_width("<svg viewBox='0 0 1 1'></svg>")


def test_stacked_shows_every_picture_at_one_scale():
    wide = gp.backward_graph(long_chain(6), alt="wide graph", caption="six steps")
    small = gp.backward_graph(small_graph()[1], alt="small graph", caption="`x * x.sigmoid()`")
    shown = gp.stacked(wide, small, caption="Two graphs, one scale")._repr_html_()
    assert shown.count("<img") == 2 and "<code>x * x.sigmoid()</code>" in shown
    widths = [float(w) for w in re.findall(r"max-width:([\d.]+)%", shown)]
    # The widest may take the page's width; the other shrinks by the same factor.
    assert widths[0] == 100.0 if wide.width_pt >= small.width_pt else widths[1] == 100.0
    ratio = min(wide.width_pt, small.width_pt) / max(wide.width_pt, small.width_pt)
    assert min(widths) == pytest.approx(100 * ratio, abs=0.1)


def test_stacked_rejects_bad_input():
    pic = gp.backward_graph(small_graph()[1], alt="graph", caption="a")
    with pytest.raises(ValueError, match="at least two"):
        gp.stacked(pic, caption="c")
    with pytest.raises(TypeError, match="picture 2 must be a Picture"):
        gp.stacked(pic, "not a picture", caption="c")
    with pytest.raises(ValueError, match="picture 2 needs its own caption"):
        gp.stacked(pic, gp.backward_graph(small_graph()[1], alt="graph"), caption="c")
    with pytest.raises(ValueError, match="needs a caption"):
        gp.stacked(pic, pic, caption=" ")


def long_chain(steps: int, start=None):
    """A recurrent chain: h = tanh(h @ w) ``steps`` times, summed."""
    w = torch.ones(2, 2, requires_grad=True) if start is None else start[1]
    h = torch.ones(1, 2) if start is None else start[0]
    for _ in range(steps):
        h = torch.tanh(h @ w)
    return h.sum()


def test_highlight_fills_exactly_the_chain_behind_a_tensor():
    w = torch.ones(2, 2, requires_grad=True)
    h = torch.ones(1, 2)
    for _ in range(2):
        h = torch.tanh(h @ w)
    first = h
    loss = long_chain(3, start=(first, w))
    pic = gp.backward_graph(loss, alt="graph", highlight=first)
    assert pic.highlighted == ("MmBackward0",) * 2 + ("TanhBackward0",) * 2
    assert pic.svg.count(gp.palette.ORANGE_FILL) == 4
    plain = gp.backward_graph(loss, alt="graph")
    assert plain.highlighted == () and gp.palette.ORANGE_FILL not in plain.svg


def test_cut_after_marks_each_edge_out_of_the_tensor_s_node():
    w = torch.ones(2, 2, requires_grad=True)
    h = torch.tanh(torch.ones(1, 2) @ w)
    loss = (h @ w).sum() + h.sum()  # h is used twice: two cut edges
    pic = gp.backward_graph(loss, alt="graph", cut_after={"h.detach()": h})
    assert pic.cuts == {("h.detach()", "MmBackward0"), ("h.detach()", "SumBackward0")}
    assert svg_texts(pic.svg).count("✂ h.detach()") == 2
    assert "✂" not in "".join(svg_texts(gp.backward_graph(loss, alt="graph").svg))


def test_marks_reject_tensors_outside_the_graph():
    x, loss = small_graph()
    other = torch.ones(2, requires_grad=True) * 2
    with pytest.raises(ValueError, match="not in this graph"):
        gp.backward_graph(loss, alt="graph", cut_after={"other": other})
    with pytest.raises(ValueError, match="highlight takes a computed tensor"):
        gp.backward_graph(loss, alt="graph", highlight=x)
    with pytest.raises(TypeError, match="not tensors"):
        gp.backward_graph(loss, alt="graph", cut_after={"h": 3})


def test_long_chain_draws_without_recursion_error():
    x = torch.ones(1, requires_grad=True)
    y = x
    for _ in range(2000):
        y = y * 1.0001
    pic = gp.backward_graph(y, alt="a 2,000-step chain")
    assert pic.svg.count("MulBackward0") == 2000


# --- the graph walk ------------------------------------------------------------


def test_backward_edges_count_each_use_and_follow_the_graph():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x.sigmoid()
    out = (y * y).sum()
    pairs = [(type(e.source).__name__, type(e.target).__name__) for e in gp.backward_edges(out)]
    assert sorted(pairs) == [
        ("AccumulateGrad", "SigmoidBackward0"),
        ("MulBackward0", "SumBackward0"),
        ("SigmoidBackward0", "MulBackward0"),
        ("SigmoidBackward0", "MulBackward0"),  # y * y: one edge per use
    ]
    assert all(e.source.next_functions is not None for e in gp.backward_edges(out))
    assert gp.backward_edges(x) == []


def test_backward_edges_walk_a_deep_graph_without_recursion():
    x = torch.ones(1, requires_grad=True)
    y = x
    for _ in range(5000):
        y = y * 1.0001
    assert len(gp.backward_edges(y)) == 5000


def test_grad_fn_names_lists_what_a_detach_removes():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    assert gp.grad_fn_names(x * x.sigmoid()) == [
        "AccumulateGrad",
        "MulBackward0",
        "SigmoidBackward0",
    ]
    assert gp.grad_fn_names(x * x.sigmoid().detach()) == ["AccumulateGrad", "MulBackward0"]
    assert gp.grad_fn_names(x.detach()) == []


# --- hooks -----------------------------------------------------------------


def save_grad(name, store):
    def hook(grad):
        store[name] = grad

    return hook


def test_backward_graph_marks_hooks_on_computed_and_leaf_tensors():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x.pow(2)

    def keep(grad):
        return None

    y.register_hook(keep)
    x.register_post_accumulate_grad_hook(lambda t: None)
    texts = svg_texts(gp.backward_graph((x + y).sum(), alt="graph", names={"x": x, "y": y}).svg)
    assert "hook keep" in texts and "on y:" in texts
    assert "post-accumulate hook <lambda>" in texts and "on x:" in texts


def test_removed_hook_is_not_drawn():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x.pow(2)
    handle = y.register_hook(lambda g: g)
    handle.remove()
    svg = gp.backward_graph(y.sum(), alt="graph", names={"y": y}).svg
    assert "hook" not in svg


def test_a_hook_made_by_a_factory_is_named_by_the_call_that_made_it():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    grads = {}
    x.register_hook(save_grad("x", grads))
    assert gp.hooks_on(x) == ["hook save_grad('x')"]
    assert graph.hook_name(print) == "print"


# --- forward view ------------------------------------------------------------


def detach_example(cut: bool):
    x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    with gp.record() as rec:
        s = x.sigmoid()
        u = s.detach() if cut else s
        y = x * u
    return rec, x, s, u, y


def test_forward_view_draws_the_cut():
    rec, x, s, u, y = detach_example(cut=True)
    view = gp.forward_view(rec, y, alt="view")
    assert view.cut_names == {("s", "u")}
    assert "✂ detach" in view.svg
    red_dashed = re.findall(rf'stroke="{gp.palette.RED}"[^>]*stroke-dasharray', view.svg)
    assert len(red_dashed) >= 2  # into and out of the detach


def test_forward_view_without_detach_has_no_cut():
    rec, x, s, u, y = detach_example(cut=False)
    view = gp.forward_view(rec, y, alt="view")
    assert view.cut_names == set()
    assert "✂" not in view.svg
    assert view.greyed_names == set()


def _grad_is_none_after_backward(named: dict, output):
    for t in named.values():
        if t.requires_grad and not t.is_leaf:
            t.retain_grad()
    output.sum().backward()
    return {name for name, t in named.items() if t.grad is None}


@pytest.mark.parametrize("cut", [True, False])
def test_greyed_nodes_are_exactly_those_backward_leaves_without_gradient(cut):
    rec, x, s, u, y = detach_example(cut)
    view = gp.forward_view(rec, y, alt="view")
    assert view.greyed_names == _grad_is_none_after_backward({"x": x, "s": s, "u": u, "y": y}, y)


def test_greyed_follow_autograd_in_a_branching_graph():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([3.0, 4.0], requires_grad=True)
    const = torch.tensor([1.0, 1.0])
    with gp.record() as rec:
        left = a * 2
        unused = b.exp()  # computed, but not part of `out`
        cut = (b + 1).detach()
        out = left + cut + const
    view = gp.forward_view(rec, out, alt="view")
    named = {"a": a, "b": b, "const": const, "left": left, "unused": unused, "cut": cut, "out": out}
    assert view.greyed_names == _grad_is_none_after_backward(named, out)
    unnamed = [v for v in view.values if not v.name]
    assert [(v.shape, v.gets_grad) for v in unnamed] == [((2,), False), ((2,), True)]
    assert "b" in view.greyed_names and "unused" in view.greyed_names
    assert "a" not in view.greyed_names


def test_detach_in_place_and_data_are_cuts_and_states_are_named_by_what_changed_them():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with gp.record() as rec:
        m = x * 2
        m.detach_()
        d = x.data
        y = x * m + d
    view = gp.forward_view(rec, y, alt="view")
    cut_ops = sorted(s.name for s in view.steps if s.cut)
    assert cut_ops == ["data", "detach_"]
    # m appears twice: before and after its in-place detach; only the later state is grey
    assert {"m", "m after detach_()"} <= {v.name for v in view.values}
    assert ("m", "m after detach_()") in view.cut_names
    assert view.greyed_names == {"m", "m after detach_()", "d"}  # y uses m only after the cut
    assert "m after detach_()" in svg_texts(view.svg)
    assert not any("(v0)" in t or "(v1)" in t for t in svg_texts(view.svg))


def test_the_state_before_an_in_place_detach_keeps_its_gradient():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with gp.record() as rec:
        m = x * 2
        y = m * 3
        m.detach_()
        y_later = m * 3
        total = y + y_later
    view = gp.forward_view(rec, total, alt="view")
    assert view.greyed_names == {"m after detach_()", "y_later"}
    assert view.cut_names == {("m", "m after detach_()")}


def test_forward_view_marks_hooks():
    rec, x, s, u, y = detach_example(cut=True)

    def double(grad):
        return 2 * grad

    handle = x.register_hook(double)
    view = gp.forward_view(rec, y, alt="view")
    assert view.hooked_names == {"x"}
    assert "hook double" in svg_texts(view.svg)
    handle.remove()
    assert gp.forward_view(rec, y, alt="view").hooked_names == set()


def test_forward_view_notes_say_which_hook():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with gp.record() as rec:
        z1, z2 = x + 1, x * 2
        loss = (z1 * z2).sum()
    grads = {}
    for name, tensor in (("z1", z1), ("z2", z2)):
        tensor.register_hook(save_grad(name, grads))
    texts = svg_texts(gp.forward_view(rec, loss, alt="view").svg)
    assert "hook save_grad('z1')" in texts and "hook save_grad('z2')" in texts
    assert "hook hook" not in texts


def test_forward_view_is_byte_stable():
    rec1, *_, y1 = detach_example(True)
    rec2, *_, y2 = detach_example(True)
    assert gp.forward_view(rec1, y1, alt="v").svg == gp.forward_view(rec2, y2, alt="v").svg


def _ops_under_test(x, w):
    # matmul, relu, indexing, an in-place op on a non-leaf, sum and mean
    h = (x @ w).relu()
    h = h[:, 1:] * 3
    h.mul_(2)
    h.add_(1)
    return h.sum() + h.mean()


def test_recording_leaves_gradients_unchanged():
    torch.manual_seed(0)
    x0, w0 = torch.randn(4, 3), torch.randn(3, 5)
    grads = []
    for recording in (False, True):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        if recording:
            with gp.record() as rec:
                loss = _ops_under_test(x, w)
            assert len(rec.calls) >= 6
        else:
            loss = _ops_under_test(x, w)
        loss.backward()
        grads.append((loss.detach(), x.grad, w.grad))
    for plain, recorded in zip(*grads, strict=True):
        assert torch.equal(plain, recorded)


def test_forward_view_bad_input():
    rec, x, s, u, y = detach_example(cut=True)
    with pytest.raises(TypeError, match="expected the Recording"):
        gp.forward_view("not a recording", y, alt="v")
    with pytest.raises(TypeError, match="got float"):
        gp.forward_view(rec, 1.0, alt="v")
    with pytest.raises(ValueError, match="no autograd graph"):
        gp.forward_view(rec, u, alt="v")
    with pytest.raises(ValueError, match="not computed inside this recording"):
        gp.forward_view(rec, (x * 5).sum(), alt="v")
    with gp.record() as empty:
        pass
    with pytest.raises(ValueError, match="recording is empty"):
        gp.forward_view(empty, y, alt="v")


def test_forward_view_works_after_backward():
    rec, x, s, u, y = detach_example(cut=True)
    before = gp.forward_view(rec, y, alt="v")
    y.sum().backward()
    assert gp.forward_view(rec, y, alt="v").svg == before.svg


# --- folding long tails ----------------------------------------------------------


def test_long_chain_forward_view_is_one_folded_box():
    x = torch.ones(1, requires_grad=True)
    with gp.record() as rec:
        y = x
        for _ in range(2000):
            y = y * 1.0001
    view = gp.forward_view(rec, y, alt="a 2,000-step chain")
    assert [v.name for v in view.values] == ["x", "y"] and not view.greyed_names
    assert [s.name for s in view.steps] == ["mul ×2000"]


def test_a_tail_of_unnamed_results_is_one_box_and_names_stop_the_fold():
    p = torch.ones(2, 3, requires_grad=True)
    z = torch.ones(2, 3, requires_grad=True)
    with gp.record() as rec:
        loss = -(p * z.detach()).sum(dim=1).mean()
        half = (p * 2).sum()
        named = half.exp()
        total = loss + named
    view = gp.forward_view(rec, total, alt="view")
    names = [s.name for s in view.steps]
    assert "mul → sum → mean → neg" in names  # four steps, one box
    assert "detach" in names  # a cut never folds
    assert "mul" in names and "sum" in names  # two steps: too short to fold
    assert {"half", "named", "total"} <= {v.name for v in view.values}


def test_greyed_unnamed_values_are_never_folded_away():
    rec, *_, y = detach_example(cut=True)
    assert [v.gets_grad for v in gp.forward_view(rec, y, alt="v").values].count(False) == 2


def test_walk_returns_plain_records():
    rec, x, s, u, y = detach_example(cut=True)
    values, steps = forward.walk(rec, y)
    assert [(v.name, v.shape, v.gets_grad) for v in values] == [
        ("x", (3,), True),
        ("s", (3,), False),
        ("u", (3,), False),
        ("y", (3,), True),
    ]
    assert [(s.name, s.cut) for s in steps] == [
        ("sigmoid", False),
        ("detach", True),
        ("mul", False),
    ]


def test_text_repr_is_short_and_deterministic():
    rec, *_, y = detach_example(cut=True)
    text = repr(gp.forward_view(rec, y, alt="view"))
    assert "<svg" not in text and len(text) < 500
    assert "greyed_names=['s', 'u']" in text


# --- plots -----------------------------------------------------------------------


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [1.0, 0.5, 0.25], label="loss", color=gp.palette.BLUE)
    ax.legend()
    return fig


def test_plot_picture_is_byte_stable_and_closes_the_figure():
    import matplotlib.pyplot as plt

    first = gp.plot_picture(_figure(), alt="a falling line").svg
    second = gp.plot_picture(_figure(), alt="a falling line").svg
    assert first == second and first.lstrip().startswith("<?xml")
    assert plt.get_fignums() == []


def test_plot_picture_fits_a_wide_figure_to_the_column_and_keeps_its_fonts():
    import re

    import matplotlib.pyplot as plt

    from gradstop.pictures import COLUMN_INCHES

    def svg_width(width):
        fig, ax = plt.subplots(figsize=(width, 3))
        ax.plot([0, 1], [0, 1], label="loss")
        ax.legend(fontsize=8)
        svg = gp.plot_picture(fig, alt="a line").svg
        return float(re.search(r'width="([\d.]+)pt"', svg).group(1))

    wide, narrow = svg_width(12), svg_width(3)
    assert wide <= COLUMN_INCHES * 72  # shrunk: tight cropping only makes it narrower
    assert narrow < 3 * 72  # a narrow figure is left as it was
    fig, ax = plt.subplots(figsize=(12, 3))
    text = ax.set_title("title", fontsize=9)
    gp.plot_picture(fig, alt="a title")
    assert fig.get_size_inches()[0] == pytest.approx(COLUMN_INCHES)
    assert text.get_fontsize() == 9  # the fonts keep their size in points


def test_plot_picture_bad_input():
    with pytest.raises(TypeError, match="expected a matplotlib Figure, got str"):
        gp.plot_picture("figure", alt="x")
    with pytest.raises(ValueError, match="alt text is required"):
        gp.plot_picture(_figure(), alt="")


# --- the package's own rules -------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gradstop"
LONGEST = 40  # lines per function, docstring included: one screenful
HEX_COLOUR = re.compile(r"""["']#[0-9a-fA-F]{6}["']""")
LABEL_SPLIT = re.compile(r"""\.split\(\s*["']\\n["']""")


def long_functions(folder: Path) -> list[str]:
    """Every function in ``folder``'s modules longer than LONGEST lines."""
    found = []
    for module in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text("utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > LONGEST:
                    found.append(f"{module.name}: {node.name} has {length} lines")
    return found


def code_problems(where: str, code: str) -> list[str]:
    """A hex colour typed in, or a display label parsed back into a name."""
    problems = []
    if HEX_COLOUR.search(code):
        problems.append(f"{where}: types a hex colour; use gp.palette")
    if LABEL_SPLIT.search(code):
        problems.append(f"{where}: splits a display label; assert on the picture's names")
    return problems


def notebook_problems(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [
        problem
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for problem in code_problems(f"{path.name}, cell {index}", cell.source)
    ]


def test_no_function_in_the_package_is_longer_than_a_screenful():
    assert long_functions(PACKAGE) == []


def test_colours_come_from_the_palette_and_assertions_use_names():
    notebooks = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("book/*.ipynb")])
    problems = [p for path in notebooks for p in notebook_problems(path)]
    sources = [*sorted(ROOT.glob("tests/*.py")), *sorted(PACKAGE.rglob("*.py"))]
    problems += [
        p
        for path in sources
        if path.name != "palette.py"
        for p in code_problems(path.name, path.read_text("utf-8"))
    ]
    assert problems == []


def test_the_package_pins_what_the_book_pins():
    # A downloaded chapter installs the package's own pins; they must be the book's.
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    pinned = dict(d.split("==") for d in project["dependencies"] if "==" in d)
    book = dict(
        line.split("==")
        for line in (ROOT / "requirements.txt").read_text("utf-8").splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert pinned and all(book[name] == version for name, version in pinned.items())


def test_the_rules_catch_a_deliberate_break(tmp_path):
    package = tmp_path / "gradstop"
    shutil.copytree(PACKAGE, package)
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST))
    with (package / "graph.py").open("a") as module:
        module.write(f"\n\ndef too_long():\n{body}")
    assert long_functions(package) == [f"graph.py: too_long has {LONGEST + 1} lines"]
    chapter = nbformat.read(ROOT / "notebooks" / "01-autograd-graph.ipynb", as_version=4)
    blue = "#" + "1f5fa8"  # spelled in two parts, so that this file passes its own rule
    chapter.cells.append(nbformat.v4.new_code_cell(f'ax.plot(y, color="{blue}")'))
    chapter.cells.append(nbformat.v4.new_code_cell('{label.split("\\n")[0] for label in a}'))
    broken = tmp_path / "01-broken.ipynb"
    nbformat.write(chapter, broken)
    problems = notebook_problems(broken)
    assert len(problems) == 2
    assert "hex colour" in problems[0] and "display label" in problems[1]


def _svg_graph(svg: str) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """Node title -> its text, and the edges (from, to), of a Graphviz SVG."""
    items = re.findall(r'class="(node|edge)">\s*<title>(.*?)</title>(.*?)</g>', svg, re.S)
    text = {t: " ".join(re.findall(r"<text[^>]*>(.*?)</text>", body)) for k, t, body in items}
    nodes = {t: text[t] for k, t, _ in items if k == "node"}
    edges = {tuple(t.split("&#45;&gt;")) for k, t, _ in items if k == "edge"}
    return nodes, edges


def test_hook_notes_are_joined_to_the_hooked_tensors():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x.pow(2)
    y.register_hook(lambda grad: None)
    x.register_post_accumulate_grad_hook(lambda t: None)
    svg = gp.backward_graph((x + y).sum(), alt="graph", names={"x": x, "y": y}).svg
    nodes, edges = _svg_graph(svg)

    def node(starting):
        (name,) = [n for n, text in nodes.items() if text.startswith(starting)]
        return name

    # y's note beside y's backward node, x's note on the leaf x itself
    assert (node("on y:"), node("PowBackward0")) in edges
    assert (node("on x:"), node("x ")) in edges


def test_print_table_aligns_columns_and_reads_booleans_as_yes_no(capsys):
    gp.print_table(
        {
            "a leaf": {"is_leaf": True, "grad_fn": None},
            "y": {"is_leaf": False, "grad_fn": "MulBackward0"},
        }
    )
    assert capsys.readouterr().out.splitlines() == [
        "case    is_leaf  grad_fn",
        "a leaf  yes      None",
        "y       no       MulBackward0",
    ]


def test_print_table_names_its_first_column(capsys):
    gp.print_table({"x * 2": {"saved": 1}}, first="operation")
    assert capsys.readouterr().out.splitlines()[0] == "operation  saved"


@pytest.mark.parametrize(
    "rows",
    [
        {},
        [],
        {"a": {"x": 1}, "b": {"y": 1}},
        {"a": {"x": 1, "y": 2}, "b": {"y": 2, "x": 1}},
        {"a": 3},
    ],
    ids=["empty", "not a dict", "other columns", "other order", "row not a dict"],
)
def test_print_table_rejects_rows_that_are_not_one_table(rows):
    with pytest.raises(ValueError, match="rows must be|has columns"):
        gp.print_table(rows)


# --- the palette, for readers with colour vision deficiency ---------------------------

# Machado, Oliveira and Fernandes (2009), "A physiologically-based model for simulation
# of color vision deficiency", severity 1: matrices on linear RGB.
DICHROMACY = {
    "protanopia": [
        [0.152286, 1.052583, -0.204868],
        [0.114503, 0.786281, 0.099216],
        [-0.003882, -0.048116, 1.051998],
    ],
    "deuteranopia": [
        [0.367322, 0.860646, -0.227968],
        [0.280085, 0.672501, 0.047413],
        [-0.011820, 0.042940, 0.968881],
    ],
    "tritanopia": [
        [1.255528, -0.076749, -0.178779],
        [-0.078411, 0.930809, 0.147602],
        [0.004733, 0.691367, 0.303900],
    ],
}


def linear_rgb(colour) -> torch.Tensor:
    """A palette colour ('#rrggbb'), or (r, g, b) in 0-255, as linear RGB."""
    if isinstance(colour, str):
        colour = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    c = torch.tensor(colour, dtype=torch.float64) / 255
    return torch.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def cielab(rgb: torch.Tensor) -> torch.Tensor:
    """Linear RGB (sRGB primaries, D65) as CIELAB."""
    to_xyz = torch.tensor(
        [[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]],
        dtype=torch.float64,
    )
    xyz = to_xyz @ rgb.clamp(0, 1) / torch.tensor([0.95047, 1.0, 1.08883], dtype=torch.float64)
    f = torch.where(xyz > (6 / 29) ** 3, xyz ** (1 / 3), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return torch.stack([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_blue_and_red_stay_apart_for_colour_blind_readers():
    # Chapter 6's curves tell the runs with and without the stop-gradient apart by these
    # two colours alone. A CIELAB distance of 2 is about the least anyone notices; 40
    # is two colours nobody confuses.
    blue, red = linear_rgb(gp.palette.BLUE), linear_rgb(gp.palette.RED)
    assert (cielab(blue) - cielab(red)).norm() > 40
    for kind, matrix in DICHROMACY.items():
        seen = torch.tensor(matrix, dtype=torch.float64)
        assert (cielab(seen @ blue) - cielab(seen @ red)).norm() > 40, kind
    # and the check can fail: this dark green, far from the red for most readers, is
    # the same colour as the red for a protanope
    green = linear_rgb((7, 96, 42))
    protan = torch.tensor(DICHROMACY["protanopia"], dtype=torch.float64)
    assert (cielab(red) - cielab(green)).norm() > 40
    assert (cielab(protan @ red) - cielab(protan @ green)).norm() < 2
