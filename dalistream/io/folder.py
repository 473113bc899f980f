"""The one check of a folder dalistream keeps files in that it later trusts (the scan cache, the
byte cache): created private when missing, and refused when another user could plant entries."""

from __future__ import annotations

import os
from typing import Optional


def folder_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot hold trusted cache files, or ``None`` when it can: created private
    (0700) if missing; it must be writable, owned by this user and not writable by every user
    (entries planted there by others would be believed)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            return "not writable"
        st = os.stat(path)
    except OSError as e:
        return e.strerror or str(e)
    if st.st_uid != os.getuid():
        return f"owned by another user (uid {st.st_uid}): its entries could be planted"
    if st.st_mode & 0o002:
        return f"writable by every user (mode {oct(st.st_mode & 0o7777)}): its entries could be planted"
    return None
