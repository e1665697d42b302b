"""Who a request runs as. Until API keys land (issue 8), every request runs with the
operator's access, exactly as before; routes take ``CallerDep`` so that access control has one
place to plug in."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.core.access import Caller


def get_caller(request: Request) -> Caller:
    """The request's caller (set by authentication), else operator access."""
    caller = getattr(request.state, "caller", None)
    return caller if isinstance(caller, Caller) else Caller.operator()


CallerDep = Annotated[Caller, Depends(get_caller)]
