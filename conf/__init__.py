"""Typed configuration: frozen dataclasses plus a loader (defaults < TOML < env < --set)."""

from conf.broker import BrokerConfig, LongPollingConfig
from conf.loader import ConfigError, dump_toml, load
from conf.store import StoreConfig

__all__ = ["BrokerConfig", "ConfigError", "LongPollingConfig", "StoreConfig", "dump_toml", "load"]
