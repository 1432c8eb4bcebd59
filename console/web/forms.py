"""Forms for the console's actions: they validate input; the services decide."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from django import forms

from console.agents import agent_names
from console.models import OnReject
from console.records.inputs import MAX_TEXT_CHARS, InputRefused, check_kept, load_json, unstorable
from console.records.spend import money
from guard import Limits
from guard.steps import DIMENSIONS

REASON_HELP = "Say why: it goes to the audit log with your name."


class StopForm(forms.Form):
    reason = forms.CharField(
        max_length=4000, widget=forms.Textarea(attrs={"rows": 3}), help_text=REASON_HELP
    )


class BulkForm(forms.Form):
    """One action on many tasks of the task list: those ticked on the page, or every task
    the list's filters match (``query``: the list's query string), with one reason."""

    ACTIONS = [
        ("stop", "Stop or cancel"),
        ("resume", "Approve resumption"),
    ]
    # "selected" first: a form that names no task changes nothing.
    SCOPES = [("selected", "The tasks ticked"), ("matching", "Every task the filters match")]
    action = forms.ChoiceField(choices=ACTIONS)
    scope = forms.ChoiceField(choices=SCOPES)
    reason = forms.CharField(max_length=4000, help_text=REASON_HELP)
    query = forms.CharField(max_length=4000, required=False)


class ResolveForm(forms.Form):
    DECISIONS = [
        ("committed", "It happened (mark committed)"),
        ("not_committed", "It did not happen (mark not committed)"),
    ]
    decision = forms.ChoiceField(choices=DECISIONS, widget=forms.RadioSelect)
    evidence = forms.CharField(
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="A reference in the business system, or a note on how you checked.",
    )
    # No length of its own: the service bounds a result as JSON (MAX_RESULT_BYTES) for every
    # door, so that a form and the API refuse the same result in the same words.
    result = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=(
            "If it happened and you know what the tool returned: its data alone, as JSON "
            "(optional). The agent is given it as the result's data when it asks for this "
            'write again; do not wrap it in {"kind": …, "data": …}.'
        ),
    )
    override = forms.CharField(
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Only when the lookup finds the action and you know it is wrong: how you know.",
    )

    def clean_result(self) -> Any:
        raw = self.cleaned_data["result"].strip()
        if not raw:
            return None
        # What is stored is what the agent is handed as the write's result: nothing the
        # database or the redaction would change may pass (NaN, a NUL, a deep cut).
        return _json_field(raw, kept=True)


class ResumeForm(forms.Form):
    """A reason, and how much more of each budget the new phase gets (``grant_<limit>``)."""

    reason = forms.CharField(
        max_length=4000, widget=forms.Textarea(attrs={"rows": 3}), help_text=REASON_HELP
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for d in DIMENSIONS:
            help_text = f"On top of the {d.label} spent so far; empty: none more."
            if d.used == "spend":
                help_text = (
                    "On top of what was spent so far, in the currency's smallest unit "
                    f"(1 is {money(1)}); empty: none more."
                )
            self.fields[f"grant_{d.limit}"] = forms.IntegerField(
                required=False, min_value=0, label=f"More {d.label}", help_text=help_text
            )

    def grant(self) -> dict[str, int]:
        """The budgets granted, by limit name; an empty or zero field grants nothing."""
        return {
            d.limit: int(amount)
            for d in DIMENSIONS
            if (amount := self.cleaned_data.get(f"grant_{d.limit}"))
        }


class ApprovalForm(forms.Form):
    """A person's answer to one held call: yes or no (the button pressed), why, and for a
    no whether the task goes on (the model is told) or ends."""

    DECISIONS = [("approve", "Approve"), ("reject", "Reject")]
    decision = forms.ChoiceField(choices=DECISIONS)
    on_reject = forms.ChoiceField(
        choices=OnReject.choices,
        required=False,
        help_text="Only for a rejection: tell the model and go on, or end the task.",
    )
    reason = forms.CharField(
        max_length=4000, widget=forms.Textarea(attrs={"rows": 2}), help_text=REASON_HELP
    )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("decision") == "reject" and not cleaned.get("on_reject"):
            self.add_error("on_reject", "say what the rejection does: go on or end the task")
        return cleaned

    @property
    def approves(self) -> bool:
        """The person said yes."""
        return bool(self.cleaned_data["decision"] == "approve")

    @property
    def resumes(self) -> bool:
        """The task goes on after the answer (always after a yes)."""
        return self.approves or self.cleaned_data["on_reject"] == OnReject.RESUME


class StartForm(forms.Form):
    agent = forms.ChoiceField(choices=())
    input = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false"}),
        initial="{}",
        help_text="The task's input, a JSON object.",
    )
    limits = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text='Budgets to override, a JSON object, e.g. {"model_calls": 10}. '
        "Known: " + ", ".join(f.name for f in fields(Limits)),
    )
    # The rule of services.task_start, said the same in the API and the operator guide:
    # optional, and at most MAX_TEXT_CHARS characters are kept.
    reason = forms.CharField(
        required=False,
        max_length=MAX_TEXT_CHARS,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=f"Optional, at most {MAX_TEXT_CHARS:,} characters: why you start it. It goes "
        'to the audit log with your name; left empty, the entry says "started from the '
        'console".',
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        agent = self.fields["agent"]
        assert isinstance(agent, forms.ChoiceField)  # noqa: S101 - narrows the type
        agent.choices = [(name, name) for name in agent_names()]
        # Built here, not at import: the currency comes from the settings.
        self.fields["limits"].help_text += (
            f". spend is in the currency's smallest unit: 20000 is {money(20_000)}"
        )

    def offer_example(self, examples: Mapping[str, str]) -> None:
        """Re-shown after an error, the form holds the chosen agent's example input in place
        of another agent's example left as it was (the agent was changed, not the input);
        ``examples`` are the agents' example inputs as JSON text, by name. Typed input is
        kept as typed."""
        agent = str(self.data.get("agent", ""))
        if not self.is_bound or agent not in examples:
            return
        typed = _parsed(str(self.data.get("input", "")))
        mine = examples[agent]
        if typed is None or typed == _parsed(mine):
            return
        other = next((n for n, e in examples.items() if n != agent and _parsed(e) == typed), None)
        if other is None:
            return
        # After validation the errors stay as they were; only what the field shows changes.
        self.data = {**self.data, "input": mine}
        self.add_error(
            "input",
            f"That was {other}'s example input; here is {agent}'s. Check it and start again.",
        )

    def _json_object(self, name: str, *, kept: bool = False) -> dict[str, Any]:
        raw = (self.cleaned_data.get(name) or "").strip() or "{}"
        value = _json_field(raw, kept=kept)
        if not isinstance(value, dict):
            raise forms.ValidationError("must be a JSON object, like {}")
        return value

    def clean_input(self) -> dict[str, Any]:
        # The agent is handed the input as stored, so it must survive storage unchanged.
        return self._json_object("input", kept=True)

    def clean_limits(self) -> dict[str, Any]:
        return self._json_object("limits")


def _parsed(text: str) -> Any:
    """``text`` as JSON, or ``None`` when it is not JSON or nests deeper than any input may
    (whitespace and key order aside, two inputs are the same when their values are). Read
    through :func:`~console.records.inputs.load_json`: this runs on every form shown again, the
    refused ones included, and ``json.loads`` alone recurses once per bracket."""
    try:
        return load_json(text)
    except InputRefused:
        return None


def _json_field(raw: str, *, kept: bool) -> Any:
    """A form field's JSON text as a value, or a field error a person can act on: not JSON,
    too deep (:data:`console.records.inputs.MAX_DEPTH`, or with ``kept``
    :data:`console.records.inputs.KEPT_DEPTH`), or holding text that cannot be stored."""
    try:
        value = load_json(raw)
        if kept:
            check_kept(value, what="")
    except InputRefused as exc:
        raise forms.ValidationError(exc.problem) from None
    problem = unstorable(value, what="")
    if problem is not None:
        raise forms.ValidationError(problem)
    return value
