"""The one normal form of an email address, used wherever two addresses are compared."""

from __future__ import annotations

import unicodedata


def normalize_email(email: str) -> str:
    """``email`` trimmed, NFKC-normalized and case-folded (the whole address).

    Python computes it and the database stores it, so lookups compare strings exactly
    and nothing depends on how PostgreSQL folds case (its ``UPPER`` turns the dotless i,
    U+0131, into I, while Python's ``lower`` leaves it alone). Compatibility characters (fullwidth
    letters, the long s, the Kelvin sign) fold to the letters they stand for. NFKC is
    applied again after folding, since folding can leave a string unnormalized.
    """
    folded = unicodedata.normalize("NFKC", email.strip()).casefold()
    return unicodedata.normalize("NFKC", folded).strip()
