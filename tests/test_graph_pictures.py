"""Unit tests of notebooks/graph_pictures.py, the chapters' shared picture helper."""

import base64
import re

import pytest
import torch

import graph_pictures as gp


def small_graph():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * x.sigmoid()
    return x, y.sum()


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
    svg = gp.backward_graph(out, alt="graph", names={"x": x}).svg
    assert re.search(r">x<", svg)


def test_renders_as_figure_with_alt_and_caption():
    pic = gp.backward_graph(small_graph()[1], alt='x "squashed" & summed', caption="The `y` graph")
    html = pic._repr_html_()
    assert 'alt="x &quot;squashed&quot; &amp; summed"' in html
    assert "<figcaption>The <code>y</code> graph</figcaption>" in html
    encoded = re.search(r'base64,([^"]+)"', html).group(1)
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
    html = gp.side_by_side(left, right, caption="SigmoidBackward0 vanished")._repr_html_()
    assert html.count("<img") == 2
    assert "without detach" in html and "<code>z.detach()</code>" in html
    assert "SigmoidBackward0 vanished" in html


def test_side_by_side_rejects_bad_input():
    pic = gp.backward_graph(small_graph()[1], alt="graph", caption="a")
    with pytest.raises(TypeError, match="must be a Picture"):
        gp.side_by_side(pic, "not a picture", caption="c")
    with pytest.raises(ValueError, match="needs its own caption"):
        gp.side_by_side(pic, gp.backward_graph(small_graph()[1], alt="graph"), caption="c")
    with pytest.raises(ValueError, match="pair needs a caption"):
        gp.side_by_side(pic, pic, caption="")


def test_long_chain_draws_without_recursion_error():
    x = torch.ones(1, requires_grad=True)
    y = x
    for _ in range(2000):
        y = y * 1.0001
    pic = gp.backward_graph(y, alt="a 2,000-step chain")
    assert pic.svg.count("MulBackward0") == 2000
    assert gp.count_grad_fns(y) == 2001  # 2,000 multiplications and x's AccumulateGrad


# --- hooks -----------------------------------------------------------------


def test_backward_graph_marks_hooks_on_computed_and_leaf_tensors():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x.pow(2)

    def save_grad(grad):
        return None

    y.register_hook(save_grad)
    x.register_post_accumulate_grad_hook(lambda t: None)
    svg = gp.backward_graph((x + y).sum(), alt="graph", names={"x": x, "y": y}).svg
    assert "hook save_grad" in svg and "on y:" in svg
    assert "post&#45;accumulate hook" in svg and "on x:" in svg


def test_removed_hook_is_not_drawn():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x.pow(2)
    handle = y.register_hook(lambda g: g)
    handle.remove()
    svg = gp.backward_graph(y.sum(), alt="graph", names={"y": y}).svg
    assert "hook" not in svg


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
    assert view.cut_edges == (("s\n(3,)", "u\n(3,)"),)
    assert "✂ detach" in view.svg
    red_dashed = re.findall(r'stroke="#d62728"[^>]*stroke-dasharray', view.svg)
    assert len(red_dashed) >= 2  # into and out of the detach


def test_forward_view_without_detach_has_no_cut():
    rec, x, s, u, y = detach_example(cut=False)
    view = gp.forward_view(rec, y, alt="view")
    assert view.cut_edges == ()
    assert "✂" not in view.svg
    assert view.greyed == ()


def names_in(labels):
    """The variable names among node labels ('x\n(3,)' -> 'x'); unnamed values are skipped."""
    return {label.split("\n")[0] for label in labels if "\n" in label}


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
    assert names_in(view.greyed) == _grad_is_none_after_backward(
        {"x": x, "s": s, "u": u, "y": y}, y
    )


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
    greyed = names_in(view.greyed)
    assert greyed == _grad_is_none_after_backward(named, out)
    assert "(2,)" in view.greyed  # the unnamed b + 1, cut off by the detach
    assert "b" in greyed and "unused" in greyed and "a" not in greyed


def test_detach_in_place_and_data_are_cuts():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with gp.record() as rec:
        m = x * 2
        m.detach_()
        d = x.data
        y = x * m + d
    view = gp.forward_view(rec, y, alt="view")
    cut_ops = sorted(op for op in ("detach_", "data") if f"✂ {op}" in view.svg)
    assert cut_ops == ["data", "detach_"]
    # m appears twice: before and after its in-place detach; only the later state is grey
    assert "m (v0)\n(2,)" in view.labels and "m (v1)\n(2,)" in view.labels
    assert "m (v1)\n(2,)" in view.greyed


def test_forward_view_marks_hooks():
    rec, x, s, u, y = detach_example(cut=True)

    def double(grad):
        return 2 * grad

    handle = x.register_hook(double)
    view = gp.forward_view(rec, y, alt="view")
    assert view.hooked == (("x", "hook double"),)
    handle.remove()
    assert gp.forward_view(rec, y, alt="view").hooked == ()


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
            assert len(rec.ops) >= 6
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


def test_long_chain_forward_view_draws_without_recursion_error():
    x = torch.ones(1, requires_grad=True)
    with gp.record() as rec:
        y = x
        for _ in range(2000):
            y = y * 1.0001
    view = gp.forward_view(rec, y, alt="a 2,000-step chain")
    assert len(view.labels) == 2001 and not view.greyed


def test_grad_fn_names_lists_what_a_detach_removes():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    assert gp.grad_fn_names(x * x.sigmoid()) == [
        "AccumulateGrad",
        "MulBackward0",
        "SigmoidBackward0",
    ]
    assert gp.grad_fn_names(x * x.sigmoid().detach()) == ["AccumulateGrad", "MulBackward0"]
    assert gp.grad_fn_names(x.detach()) == []


def test_text_repr_is_short_and_deterministic():
    rec, *_, y = detach_example(cut=True)
    text = repr(gp.forward_view(rec, y, alt="view"))
    assert "<svg" not in text and len(text) < 500
    assert "greyed=('s\\n(3,)', 'u\\n(3,)')" in text


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [1.0, 0.5, 0.25], label="loss")
    ax.legend()
    return fig


def test_plot_picture_is_byte_stable_and_closes_the_figure():
    import matplotlib.pyplot as plt

    first = gp.plot_picture(_figure(), alt="a falling line").svg
    second = gp.plot_picture(_figure(), alt="a falling line").svg
    assert first == second and first.lstrip().startswith("<?xml")
    assert plt.get_fignums() == []


def test_plot_picture_bad_input():
    with pytest.raises(TypeError, match="expected a matplotlib Figure, got str"):
        gp.plot_picture("figure", alt="x")
    with pytest.raises(ValueError, match="alt text is required"):
        gp.plot_picture(_figure(), alt="")


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
