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
