"""Unit tests of gradstop.grad_state (the table printer is tested in test_gradstop)."""

import pytest
import torch

import gradstop as gp


def test_grad_state_tells_none_zero_and_non_zero_apart():
    used, zeroed, unused = (torch.ones(2, requires_grad=True) for _ in range(3))
    (used * 2 + zeroed * 0).sum().backward()
    state = gp.grad_state({"used": used, "zeroed": zeroed, "unused": unused})
    assert state == {"used": "non-zero", "zeroed": "zero", "unused": "None"}


def test_grad_state_of_modules_agrees_or_says_mixed():
    trained, half = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    half.bias.requires_grad_(False)
    (trained(torch.ones(1, 2)) + half(torch.ones(1, 2))).sum().backward()
    state = gp.grad_state({"trained": trained, "half": half, "idle": torch.nn.Linear(2, 1)})
    assert state["trained"] == "non-zero" and state["idle"] == "None"
    assert state["half"] == "mixed (weight: non-zero, bias: None)"


def test_a_single_non_zero_element_counts_as_non_zero():
    rows = torch.zeros(3, 2, requires_grad=True)
    rows[1].sum().backward()
    assert gp.grad_state({"rows": rows}) == {"rows": "non-zero"}


def test_grad_state_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="dict of named parts"):
        gp.grad_state([torch.nn.Linear(1, 1)])
    with pytest.raises(TypeError, match="'w': expected a module or a tensor, got float"):
        gp.grad_state({"w": 1.0})
    with pytest.raises(ValueError, match="'relu' has no parameters"):
        gp.grad_state({"relu": torch.nn.ReLU()})
    computed = torch.ones(2, requires_grad=True) * 2
    with pytest.raises(ValueError, match="not a leaf"):
        gp.grad_state({"computed": computed})
    computed.retain_grad()
    computed.sum().backward()
    assert gp.grad_state({"computed": computed}) == {"computed": "non-zero"}
