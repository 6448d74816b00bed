"""The image tier (tests/image): opt-in, see test_image.py."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "image: builds the wavepipe image with buildah and runs it (WAVEPIPE_IMAGE_TEST=1)"
    )
