"""Forms of the topic and policy admin pages (CSRF on every one, through Flask-WTF)."""

from __future__ import annotations

from typing import Any

from wtforms import Field, StringField, TextAreaField
from wtforms.validators import (
    DataRequired,
    InputRequired,
    Length,
    Optional,
    Regexp,
    ValidationError,
)

from portal.consent.catalogue import CATEGORY_MAX, LABEL_MAX, SLUG, VERSION
from portal.inputs import CheckedForm, PlainText
from portal.staff.catalogue import normalise_text
from portal.staff.forms import strip


def _text(value: Any) -> Any:
    return normalise_text(value) if isinstance(value, str) else value


class RadioChoice(Field):
    """One value from a fixed list, rendered as radios in a fieldset with a legend.

    The error summary links to the first radio (``<field id>-<first value>``).
    """

    def __init__(
        self,
        label: str,
        choices: list[tuple[str, str]],
        *,
        message: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(label, **kwargs)
        self.choices = choices
        self.message = message
        self.data: str | None = None

    def process_formdata(self, valuelist: list[Any]) -> None:
        self.data = str(valuelist[0]) if valuelist else None

    def pre_validate(self, form: Any) -> None:
        if self.data not in {value for value, _ in self.choices}:
            raise ValidationError(self.message)

    @property
    def anchor(self) -> str:
        # The first radio carries the field's own id (templates/staff/_fields.html).
        return self.id


# The value of the "A new category" radio: no category's name can be empty.
NEW_CATEGORY = ""


class CategoryChoice(Field):
    """A category in use, by name, or :data:`NEW_CATEGORY`; which names are in use is the
    service's to check (they may change between the form and the final POST)."""

    def __init__(self, label: str, **kwargs: Any) -> None:
        # Its value is text, checked as every text field of a CheckedForm is.
        super().__init__(label, validators=[PlainText()], **kwargs)
        self.data: str | None = None

    def process_formdata(self, valuelist: list[Any]) -> None:
        self.data = str(valuelist[0]) if valuelist else None

    def pre_validate(self, form: Any) -> None:
        if self.data is None:
            raise ValidationError("Choose a category, or add a new one")


CLASS_CHOICES = [("marketing", "Marketing"), ("transactional", "Transactional (account messages)")]
DEFAULT_CHOICES = [("opt_out", "Off until the person turns it on"), ("opt_in", "On by default")]


class TopicForm(CheckedForm):
    slug = StringField(
        "Slug",
        filters=[strip],
        validators=[
            DataRequired("Enter a slug"),
            Length(max=64, message="The slug must be 64 characters or fewer"),
            Regexp(SLUG, message="Use lowercase letters and digits, words joined by hyphens"),
        ],
    )
    # One of the categories in use (by the name the catalogue gives it), or NEW_CATEGORY
    # with the name in ``new_category``; the rule is the service's (check_new_topic).
    category = CategoryChoice("Category")
    new_category = StringField(
        "Name of the new category",
        filters=[strip],
        validators=[
            Length(max=CATEGORY_MAX, message=f"The category is at most {CATEGORY_MAX} characters"),
        ],
    )
    label = StringField(
        "Label",
        filters=[strip],
        validators=[
            DataRequired("Enter a label"),
            Length(max=LABEL_MAX, message=f"The label is at most {LABEL_MAX} characters"),
        ],
    )
    description = TextAreaField(
        "Description",
        filters=[strip, _text],
        validators=[
            Optional(),
            Length(max=2000, message="The description is at most 2000 characters"),
        ],
    )
    topic_class = RadioChoice(
        "Class", CLASS_CHOICES, message="Choose whether the topic is marketing or transactional"
    )
    default_state = RadioChoice(
        "Default for people who have not chosen", DEFAULT_CHOICES, message="Choose a default"
    )

    def validate_new_category(self, field: Field) -> None:
        if self.category.data == NEW_CATEGORY and not field.data:
            raise ValidationError("Name the new category")

    @property
    def adds_category(self) -> bool:
        return self.category.data == NEW_CATEGORY

    @property
    def category_name(self) -> str:
        """The category as typed or chosen (the service checks and tidies it)."""
        return (self.new_category.data if self.adds_category else self.category.data) or ""


class TopicEditForm(CheckedForm):
    label = TopicForm.label
    description = TopicForm.description


class PolicyForm(CheckedForm):
    version = StringField(
        "Version",
        filters=[strip],
        validators=[
            DataRequired("Enter a version"),
            Regexp(
                VERSION,
                message="A version is 1 to 32 letters, digits, dots, hyphens or underscores, "
                "starting with a letter or digit",
            ),
        ],
    )
    text = TextAreaField(
        "Notice text",
        filters=[_text],
        validators=[
            InputRequired("Enter the notice text"),
            Length(max=100_000, message="The notice text is at most 100,000 characters"),
        ],
    )
    # The SHA-256 of the text the admin previewed: publishing needs it to match.
    previewed = StringField("Previewed", filters=[strip])

    def validate_text(self, field: Field) -> None:
        if not (field.data or "").strip():
            raise ValidationError("Enter the notice text")
