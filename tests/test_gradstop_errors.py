"""gradstop.show_error and assert_raises: an error caught on purpose, with its message."""

import pytest
import torch

import gradstop as gp


def no_grad_backward():
    torch.zeros(2).sum().backward()


MESSAGE = "element 0 of tensors does not require grad and does not have a grad_fn"


def test_show_error_prints_the_error_as_a_traceback_ends(capsys):
    error = gp.show_error(no_grad_backward, "element 0 of tensors")
    assert isinstance(error, RuntimeError) and str(error) == MESSAGE
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == f"RuntimeError: {MESSAGE}\n"


def test_assert_raises_checks_and_prints_nothing(capsys):
    error = gp.assert_raises(no_grad_backward, MESSAGE)
    assert str(error) == MESSAGE
    assert capsys.readouterr() == ("", "")


def test_another_message_or_no_error_fails_the_check():
    with pytest.raises(AssertionError, match="its message starts otherwise"):
        gp.assert_raises(no_grad_backward, "Trying to backward")
    with pytest.raises(AssertionError, match="no RuntimeError was raised"):
        gp.show_error(lambda: torch.ones(1) + 1, "anything")


def test_an_error_of_another_type_is_not_caught():
    with pytest.raises(ZeroDivisionError):
        gp.assert_raises(lambda: 1 / 0, "division")
    error = gp.assert_raises(lambda: 1 / 0, "division by zero", error=ZeroDivisionError)
    assert isinstance(error, ZeroDivisionError)


def test_bad_arguments_are_refused_with_a_clear_message():
    with pytest.raises(TypeError, match="must be a function to call, such as lambda"):
        gp.assert_raises(torch.ones(1), "x")
    with pytest.raises(ValueError, match="the start of the expected error's message"):
        gp.assert_raises(no_grad_backward, "")
