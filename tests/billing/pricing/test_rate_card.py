"""The rate card names token kinds without importing Django's choices: the
names must stay TokenKind's."""

from billing.choices import TokenKind
from billing.pricing.rate_card import TOKEN_KINDS


def test_the_rate_cards_token_kinds_are_token_kinds_values():
    assert tuple(TokenKind.values) == TOKEN_KINDS
