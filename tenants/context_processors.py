from tenants.access import principal_for_session


def principal(request):
    """Templates see `principal`: the signed-in user's tenant and rights."""
    return {"principal": principal_for_session(request)}
