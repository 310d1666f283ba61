"""Use cases. Routes, the CLI and the settings UI call these; only these call the store."""

from __future__ import annotations

from flowhook.clock import Clock
from flowhook.config import Settings
from flowhook.service.approvals import ApprovalService
from flowhook.service.auth import KeyService, Principal
from flowhook.service.disk import DiskService
from flowhook.service.flows import FlowService
from flowhook.service.hooks import HookService
from flowhook.service.overview import OverviewService
from flowhook.service.pagination import Page
from flowhook.service.retention import RetentionService
from flowhook.service.runs import RunService, Started
from flowhook.service.schedules import ScheduleService
from flowhook.service.sessions import SessionService
from flowhook.service.signals import SignalService
from flowhook.service.step_secrets import SecretService
from flowhook.service.tasks import TaskService
from flowhook.service.webhooks import WebhookService
from flowhook.store.db import Database
from flowhook.store.wakeup import Wakeup

__all__ = ["Services", "Principal", "Page", "Started"]


class Services:
    """Every use case, sharing one database, clock and wake-up signal."""

    def __init__(self, db: Database, clock: Clock, settings: Settings, wakeup: Wakeup) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings
        self.wakeup = wakeup
        self.keys = KeyService(
            db, clock, cache_seconds=settings.key_cache_seconds, rate_limit=settings.rate_limit
        )
        self.flows = FlowService(db, clock, allow_private_targets=settings.allow_private_targets)
        self.runs = RunService(db, clock, wakeup, max_active=settings.max_active_runs_per_workspace)
        self.webhooks = WebhookService(db, clock, settings)
        self.sessions = SessionService(db, clock, self.keys)
        self.hooks = HookService(db, clock)
        self.secrets = SecretService(db, clock)
        self.signals = SignalService(db, clock)
        self.approvals = ApprovalService(db, clock)
        self.tasks = TaskService(db, clock, wakeup, max_output_bytes=settings.max_step_output_bytes)
        self.schedules = ScheduleService(
            db,
            clock,
            min_seconds=settings.min_schedule_seconds,
            max_per_workspace=settings.max_schedules,
        )
        self.retention = RetentionService(
            db,
            clock,
            settings.retention_days,
            settings.delivery_retention_days,
            budget_bytes=settings.disk_budget_bytes,
        )
        self.disk = DiskService(db, settings.disk_budget_bytes)
        self.overview = OverviewService(db, clock, self.disk)
