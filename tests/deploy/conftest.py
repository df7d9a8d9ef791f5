import pytest

from tests.deploy.podman import Images, images_build, podman_missing
from tests.services import require


@pytest.fixture(scope="session")
def images() -> Images:
    missing = podman_missing()
    require(missing is None, f"containers: {missing}")
    return images_build()
