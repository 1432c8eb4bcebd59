"""The support desk's records. Writes go through ``console.demo.desk`` only.

Every business action the agents take (a refund, a notice, an export job) carries the
idempotency key the agent used as its operation key, under a unique constraint: the
database, not Python, guarantees that one key is one action, and reconcilers can look an
uncertain operation up by its key.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Order(models.Model):
    """A customer's order; refunding it moves it from ``open`` to ``refunded`` once."""

    class Status(models.TextChoices):
        OPEN = "open", "open"
        REFUNDED = "refunded", "refunded"

    number = models.PositiveIntegerField(unique=True)
    customer_email = models.EmailField()
    amount_cents = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status, default=Status.OPEN)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["number"]

    def __str__(self) -> str:
        return f"order {self.number} ({self.status})"


class OncePerKey(models.Model):
    """A business action recorded at most once per idempotency key (the agent's operation
    key): the unique constraint, not Python, makes one key one action."""

    idempotency_key = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True
        ordering = ["created_at", "id"]


class Refund(OncePerKey):
    """Money given back for an order: at most one per idempotency key."""

    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="refunds")
    amount_cents = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"refund {self.idempotency_key} ({self.amount_cents} cents)"


class Notice(OncePerKey):
    """A message sent to a customer, about an order or not: at most one per key."""

    order = models.ForeignKey(
        Order, on_delete=models.PROTECT, related_name="notices", null=True, blank=True
    )
    recipient = models.CharField(max_length=254)
    text = models.TextField()

    def __str__(self) -> str:
        return f"notice {self.idempotency_key} to {self.recipient}"


class ExportJob(OncePerKey):
    """A slow background job the agents start once and then poll.

    It finishes after ``polls_needed`` status checks; ``None`` means it never finishes,
    which is what the slow-job demo needs to run into its deadline or poll budget.
    """

    collection = models.CharField(max_length=100)
    polls_needed = models.PositiveIntegerField(null=True, blank=True)
    polls_done = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"export job {self.idempotency_key}"

    @property
    def finished(self) -> bool:
        """Whether the job has had all the status checks it needs to be done."""
        return self.polls_needed is not None and self.polls_done >= self.polls_needed


class Page(models.Model):
    """One page of a small paged dataset that the paging demos read."""

    collection = models.CharField(max_length=100)
    number = models.PositiveIntegerField()
    items = models.JSONField(default=list)

    class Meta:
        ordering = ["collection", "number"]
        constraints = [
            # Also the index behind every page read: (collection, number) is how pages are found.
            models.UniqueConstraint(fields=["collection", "number"], name="desk_page_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.collection} page {self.number}"


class Fault(models.Model):
    """A fault injected into a tool, fired once per operation key and remembered here.

    It belongs to the business side, not the agent: a resumed or redelivered task meets
    the row and does not lose the same response a second time.
    """

    class Kind(models.TextChoices):
        LOST_RESPONSE = "lost_response", "lost response"

    operation_key = models.CharField(max_length=200)
    kind = models.CharField(max_length=20, choices=Kind)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation_key", "kind"], name="desk_fault_once"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} on {self.operation_key}"
