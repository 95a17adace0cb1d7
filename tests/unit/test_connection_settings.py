"""Connection settings without a server: URL redaction, validation, the environment, and the
ACL rules against the commands the Lua scripts call."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferq.connection import ACL_COMMANDS, ConnectionSettings, acl_rules, redact_url
from inferq.errors import ConfigError
from inferq.protocol import scripts
from tests.support.docs import ROOT
from tests.support.security import QUOTED, secrets_in, worker_config


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://localhost:6379/0", "redis://localhost:6379/0"),
    ("redis://:pw@localhost:6379/0", "redis://:***@localhost:6379/0"),
    ("redis://user:pw@host/1", "redis://user:***@host/1"),
    ("rediss://user:pw@host:1", "rediss://user:***@host:1"),
    ("rediss://user:p%40ss%3Aw@host:6380/0?ssl_cert_reqs=required",
     "rediss://user:***@host:6380/0?ssl_cert_reqs=required"),
    ("redis://:p@ss@host/0", "redis://:***@host/0"),  # unencoded '@' in the password
    # a lone userinfo may be a password to some clients: masked
    ("redis://user@host/0", "redis://***@host/0"),
    ("redis://pw@host", "redis://***@host"),
    ("redis://user:@host/0", "redis://user:***@host/0"),  # whatever follows 'user:'
    ("redis://host:6379/0?db=2&password=pw&x=1", "redis://host:6379/0?db=2&password=***&x=1"),
    ("redis://host/0?password=pw&db=2", "redis://host/0?password=***&db=2"),
    ("redis://host?password=pw", "redis://host?password=***"),
    ("redis://h/0?token=t&Auth=a&pass=p&passwd=q&user=u",
     "redis://h/0?token=***&Auth=***&pass=***&passwd=***&user=u"),
    ("unix://:pw@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
    ("redis://u:pw@[::1]:6379/0#x", "redis://u:***@[::1]:6379/0#x"),
])
def test_redact_url_hides_what_may_be_a_secret_and_nothing_else(url: str, shown: str) -> None:
    """The one redaction (the gateway's logs use it too)."""
    assert redact_url(url) == shown


def test_settings_never_show_the_password() -> None:
    settings = ConnectionSettings(f"redis://app:{QUOTED}@h:1/0", password="other-secret")
    assert secrets_in(repr(settings)) == [] and "other-secret" not in repr(settings)
    assert settings.redacted_url == "redis://app:***@h:1/0"
    config = worker_config(f"redis://:{QUOTED}@h:1/0", "t")
    assert secrets_in(repr(config)) == []
    with pytest.raises(ConfigError) as bad:
        ConnectionSettings(f"http://:{QUOTED}@h:1/0")
    assert "http://:***@h:1/0" in str(bad.value) and secrets_in(str(bad.value)) == []


def test_settings_validation_names_the_bad_value(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with pytest.raises(ConfigError, match=r"ssl_ca_certs=.*needs a rediss:// URL.*:\*\*\*@"):
        ConnectionSettings(f"redis://:{QUOTED}@h/0", ssl_ca_certs=str(ca))
    with pytest.raises(ConfigError, match=r"ssl_certfile must be a readable file.*missing.pem"):
        ConnectionSettings("rediss://h/0", ssl_certfile=str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match=r"ssl_keyfile=.* needs ssl_certfile"):
        ConnectionSettings("rediss://h/0", ssl_keyfile=str(ca))
    with pytest.raises(ConfigError, match="ssl_cert_reqs"):
        ConnectionSettings("rediss://h/0", ssl_cert_reqs="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ssl_cert_reqs='none' needs a rediss://"):
        ConnectionSettings("redis://h/0", ssl_cert_reqs="none")
    with pytest.raises(ConfigError, match="retries"):
        ConnectionSettings(retries=-1)
    with pytest.raises(ConfigError, match=r"tls_ca|ssl_ca_certs"):
        ConnectionSettings("redis://h/0", ssl_ca_certs=str(ca))  # TLS files need rediss://


def test_settings_from_the_environment(tmp_path: Path) -> None:
    ca, cert = tmp_path / "ca.pem", tmp_path / "cert.pem"
    ca.write_text("x")
    cert.write_text("x")
    env = {"INFERQ_REDIS_URL": "rediss://:pw@h:6380/0", "INFERQ_TLS_CA": str(ca),
           "INFERQ_TLS_CERT": str(cert)}
    s = ConnectionSettings.from_env(environ=env)
    assert (s.url, s.ssl_ca_certs, s.ssl_certfile, s.ssl_keyfile) == \
        ("rediss://:pw@h:6380/0", str(ca), str(cert), None)
    explicit = ConnectionSettings.from_env("rediss://other/0", environ=env, ssl_certfile=None,
                                           ssl_cert_reqs="optional")
    assert (explicit.url, explicit.ssl_certfile, explicit.ssl_cert_reqs) == \
        ("rediss://other/0", str(cert), "optional")  # None means "not given"
    assert ConnectionSettings.from_env(environ={}).url == "redis://localhost:6379/0"


def test_minimal_acl_covers_every_command_the_scripts_call() -> None:
    called = {m.lower() for source in scripts.ALL.values()
              for m in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", source)}
    assert called, "found no redis.call in the scripts"
    missing = called - set(ACL_COMMANDS)
    assert not missing, (f"add {sorted(missing)} to inferq.connection.ACL_COMMANDS "
                         "(and docs/guides/security.md)")


def test_the_security_guide_lists_the_acl_rules_the_code_builds() -> None:
    guide = (ROOT / "docs" / "guides" / "security.md").read_text(encoding="utf-8")
    start = guide.index("```\nACL SETUSER inferq") + 4
    block = guide[start:guide.index("```", start)]
    assert block.split() == ["ACL", "SETUSER", "inferq", "on", ">PASSWORD", *acl_rules()]
