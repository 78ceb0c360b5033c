"""The handles a use case needs (settings, database, object store, queues),
built once per process from Settings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import redis

from jobs.core.dispatch import Dispatcher, make_celery
from jobs.core.settings import Settings
from storage.db import Database
from storage.objects import ObjectStore
from storage.stores import open_store


@dataclass
class Context:
    settings: Settings

    @cached_property
    def db(self) -> Database:
        return Database(self.settings.database_url)

    @cached_property
    def store(self) -> ObjectStore:
        return open_store(self.settings.object_store_url)

    @cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.redis_url, socket_timeout=None,
                                    health_check_interval=30)

    @cached_property
    def dispatcher(self) -> Dispatcher:
        return Dispatcher(make_celery(self.settings))

    def close(self) -> None:
        if "db" in self.__dict__:
            self.db.dispose()
        if "redis" in self.__dict__:
            self.redis.close()
