"""What the browser tests do to the widgets' controls, in one place."""

from __future__ import annotations


def set_number(box, value) -> None:
    """Type a number into an ipywidgets number box and commit it (Enter)."""
    field = box.locator("input")
    field.fill(str(value))
    field.press("Enter")


def stepper_greedy_chat(root, prompt: str, max_new: int) -> None:
    """The generation stepper set for a repeatable answer: the prompt, temperature 0, the chat template, a budget."""
    root.locator(".la-stepper-prompt textarea").fill(prompt)
    set_number(root.locator(".la-stepper-temperature"), 0)
    chat = root.locator(".la-stepper-chat input[type=checkbox]")
    if not chat.is_checked():
        chat.check()
    set_number(root.locator(".la-stepper-max-new"), max_new)
