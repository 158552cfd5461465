"""One masking function for every URL and command line shown: each way a credential can sit in a URL
(user info, a bare user name, query, fragment, and the forms a URL parser misreads) is masked in
mask_url, mask_text, mask_command, the store URL parser's errors and the log lines."""

from __future__ import annotations

import logging

import pytest

from cachelib.in_image.masking import install_log_masking, mask_command, mask_text, mask_url
from cachelib.stores import StoreURLError, parse_store_url

# (URL, the secret in it, what it is shown as)
FORMS = [
    ("redis://h:p/0?password=PW1xyz", "PW1xyz", "redis://h:p/0?password=***"),
    ("redis://:pa#PW2xyz@h", "PW2xyz", "redis://***@h"),
    ("redis://:pa/PW3xyz@h", "PW3xyz", "redis://***@h"),
    ("redis://:pa?PW4xyz@h", "PW4xyz", "redis://***@h"),
    ("redis://TOKEN5xyz@host", "TOKEN5xyz", "redis://***@host"),
    ("s3://bucket/p?endpoint=http://s3:9000&aws_secret_access_key=SK6xyz", "SK6xyz",
     "s3://bucket/p?endpoint=http://s3:9000&aws_secret_access_key=***"),
    ("s3://bucket/p?X-Amz-Signature=SIG7xyz&region=eu", "SIG7xyz", "s3://bucket/p?X-Amz-Signature=***&region=eu"),
    ("rediss://user8xyz:pw8xyz@h:6380/0?ca=/etc/ca.pem", "pw8xyz", "rediss://***@h:6380/0?ca=/etc/ca.pem"),
    ("redis://h:6379/0#FRAG9xyz", "FRAG9xyz", "redis://h:6379/0#***"),
    ("redis://u:p%40ss10xyz@h/0", "ss10xyz", "redis://***@h/0"),
]


@pytest.mark.parametrize(("url", "secret", "shown"), FORMS)
def test_each_form_is_masked_alone_in_text_and_in_a_command_line(url: str, secret: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert secret not in mask_text(f"store URL {url!r} is bad; see {url}.")
    assert f"'{shown}'" in mask_text(f"store URL {url!r} is bad")
    argv = mask_command(["compilecache", "ls", "--store", url, f"--store={url}"])
    assert not [a for a in argv if secret in a] and argv[3] == shown


@pytest.mark.parametrize(("url", "secret", "shown"), FORMS)
def test_the_store_url_parser_never_repeats_a_secret(url: str, secret: str, shown: str) -> None:
    try:
        parse_store_url(url)
    except StoreURLError as exc:
        assert secret not in str(exc)


def test_words_and_options_that_hold_secrets() -> None:
    assert mask_text("connect failed: password=hunter2 user=bob") == "connect failed: password=*** user=bob"
    assert mask_text("admin:hunter2@redis.cache:6379 refused") == "***@redis.cache:6379 refused"
    assert mask_text("spec.storage.secretRef.keys.password: 'x' is not a Secret key") == (
        "spec.storage.secretRef.keys.password: 'x' is not a Secret key"), "field paths stay readable"
    assert mask_text("[registry[:port]/]repository[:tag][@digest]") == "[registry[:port]/]repository[:tag][@digest]"
    assert mask_command(["x", "--password", "hunter2", "--token=t0k", "--trusted-key", "/keys/pub", "--ca", "/ca"]) == [
        "x", "--password", "***", "--token=***", "--trusted-key", "/keys/pub", "--ca", "/ca"]
    assert mask_url("file:///var/cache/x") == "file:///var/cache/x"


def test_log_lines_and_tracebacks_are_masked(caplog: pytest.LogCaptureFixture) -> None:
    install_log_masking()
    install_log_masking()  # idempotent
    log = logging.getLogger("test-masking")
    with caplog.at_level(logging.INFO, logger="test-masking"):
        log.info("opening %s", "redis://:hunter2@h/0")
        try:
            raise RuntimeError("cannot reach redis://TOKEN5xyz@host")
        except RuntimeError:
            log.exception("failed")
    text = caplog.text + "".join(r.exc_text or "" for r in caplog.records)
    assert "redis://***@h/0" in text and "redis://***@host" in text
    assert "hunter2" not in text and "TOKEN5xyz" not in text
