"""Properties of the CSV formula neutraliser, and the SQL that applies it in exports."""

from __future__ import annotations

import csv
import io

import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from portal.compliance.export import RISKY_FIRST, _neutralised, neutralise, restore

DANGEROUS = (*RISKY_FIRST, "'")
# Text a database column can hold: no NUL (PostgreSQL refuses it), no lone surrogates.
texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
risky_texts = st.builds(lambda first, rest: first + rest, st.sampled_from(DANGEROUS), texts)
any_text = st.one_of(texts, risky_texts)


@given(any_text)
@example('=HYPERLINK("http://evil.example","x")')
@example("@SUM(A1)")
@example("\r=1")
def test_a_spreadsheet_never_sees_a_formula(value):
    assert neutralise(value)[:1] not in RISKY_FIRST


@given(any_text)
def test_the_escape_is_reversible(value):
    assert restore(neutralise(value)) == value


@given(texts.filter(lambda v: v[:1] not in DANGEROUS))
def test_harmless_values_are_left_alone(value):
    assert neutralise(value) == value


@given(st.lists(any_text, min_size=1, max_size=6))
def test_cells_survive_a_csv_round_trip(values):
    buffer = io.StringIO(newline="")
    csv.writer(buffer, lineterminator="\r\n").writerow([neutralise(v) for v in values])
    (read,) = list(csv.reader(io.StringIO(buffer.getvalue(), newline="")))
    assert [restore(cell) for cell in read] == values
    assert all(cell[:1] not in RISKY_FIRST for cell in read)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=any_text)
@example(value="\t=cmd")
@example(value="'")
@example(value="")
def test_the_sql_neutraliser_agrees(engine, value):
    """Exports neutralise in the query (so PostgreSQL's COPY and the csv module write the
    same cells): the SQL must do exactly what :func:`neutralise` does."""
    expression = _neutralised(sa.literal(value, sa.Text), engine.dialect.name)
    with engine.connect() as conn:
        assert conn.execute(sa.select(expression)).scalar_one() == neutralise(value)
