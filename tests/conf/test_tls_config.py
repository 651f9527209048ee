"""`[tls]` (conf/tls.py): validation, loading from TOML, the environment and `--set` like the other
nested sections (broker and name server), the contexts built from it, and the CLI clients'
ROCKETQ_TLS / ROCKETQ_CA_FILE / ROCKETQ_ENDPOINTS not mistaken for broker settings."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from broker.cli import resolve_config
from conf import BrokerConfig, ConfigError, load
from conf.client import ClientConfig, with_tls
from conf.namesrv import ENV_PREFIX, NamesrvConfig
from conf.tls import TlsConfig, TlsError, broker_client_context, client_context, server_context
from namesrv.cli import resolve_namesrv_config
from tests.tls_certs import CertFiles


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"mode": "enforcing"}, "needs tls.cert_file and tls.key_file"),
    ({"mode": "permissive", "cert_file": "c.pem"}, "needs tls.cert_file and tls.key_file"),
    ({"require_client_cert": True}, "needs tls.ca_file"),
    ({"handshake_timeout_ms": 0}, "handshake_timeout_ms = 0 is out of range"),
])
def test_inconsistent_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TlsConfig(**kwargs)  # type: ignore[arg-type]


def test_broker_tls_loads_from_toml_env_and_set(tmp_path: Path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text('[tls]\nmode = "permissive"\ncert_file = "/c.pem"\nkey_file = "/k.pem"\n')
    from_file = load(BrokerConfig, file=toml, env={})
    assert from_file.tls == TlsConfig(mode="permissive", cert_file="/c.pem", key_file="/k.pem")
    layered = load(BrokerConfig, file=toml, env={"ROCKETQ_TLS__MODE": "enforcing", "ROCKETQ_TLS__CA_FILE": "/ca.pem"},
                   overrides={"tls.require_client_cert": "true", "tls.handshake_timeout_ms": "2500"})
    assert layered.tls == TlsConfig(mode="enforcing", cert_file="/c.pem", key_file="/k.pem", ca_file="/ca.pem",
                                    require_client_cert=True, handshake_timeout_ms=2_500)
    with pytest.raises(ConfigError, match=r"needs tls\.cert_file"):
        load(BrokerConfig, env={}, overrides={"tls.mode": "enforcing"})
    with pytest.raises(ConfigError, match="expected one of 'disabled', 'permissive', 'enforcing'"):
        load(BrokerConfig, env={}, overrides={"tls.mode": "on"})
    with pytest.raises(ConfigError, match=r"unknown config key 'tls\.verify'"):
        load(BrokerConfig, env={}, overrides={"tls.verify": "true"})


def test_name_server_tls_loads_from_its_environment_and_set() -> None:
    config = resolve_namesrv_config(None, None, None, ["tls.key_file=/k.pem"],
                                    {f"{ENV_PREFIX}TLS__MODE": "enforcing", f"{ENV_PREFIX}TLS__CERT_FILE": "/c.pem"})
    assert config.tls == TlsConfig(mode="enforcing", cert_file="/c.pem", key_file="/k.pem")
    assert NamesrvConfig().tls == TlsConfig()


def test_the_cli_clients_variables_are_not_broker_settings() -> None:
    env = {"ROCKETQ_TLS": "1", "ROCKETQ_CA_FILE": "/ca.pem", "ROCKETQ_ENDPOINTS": "127.0.0.1:9876",
           "ROCKETQ_TLS__MODE": "disabled"}
    assert resolve_config(None, None, None, None, [], env).tls == TlsConfig()


def test_contexts(tls_certs: CertFiles) -> None:
    assert server_context(TlsConfig()) is None and broker_client_context(TlsConfig()) is None
    plain = server_context(TlsConfig(mode="enforcing", cert_file=tls_certs.server_cert, key_file=tls_certs.server_key))
    assert plain is not None and plain.verify_mode == ssl.CERT_NONE
    mutual = server_context(TlsConfig(mode="enforcing", cert_file=tls_certs.server_cert,
                                      key_file=tls_certs.server_key, ca_file=tls_certs.ca_file,
                                      require_client_cert=True))
    assert mutual is not None and mutual.verify_mode == ssl.CERT_REQUIRED
    assert mutual.minimum_version == ssl.TLSVersion.TLSv1_2
    client = client_context(tls_certs.ca_file)
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    assert not client_context(verify=False).check_hostname


def test_unreadable_files_are_named(tmp_path: Path, tls_certs: CertFiles) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(TlsError, match=r"missing\.pem"):
        server_context(TlsConfig(mode="enforcing", cert_file=missing, key_file=tls_certs.server_key))
    with pytest.raises(TlsError, match=r"the CA file .*missing\.pem"):
        client_context(missing)
    with pytest.raises(TlsError, match=r"server\.pem"):     # a key that is not the certificate's
        server_context(TlsConfig(mode="enforcing", cert_file=tls_certs.server_cert, key_file=tls_certs.client_key))
    assert isinstance(TlsError("x"), OSError)       # so a server that cannot start says it in one line


def test_client_config_tls(tls_certs: CertFiles) -> None:
    context = client_context(tls_certs.ca_file)
    assert with_tls(None, False, None) == ClientConfig()
    assert with_tls(None, True, None).tls
    assert with_tls(ClientConfig(heartbeat_interval_ms=1_000), False, context).connection_ssl_context() is context
