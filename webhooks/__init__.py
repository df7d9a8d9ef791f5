"""Events and who hears of them: signed webhooks (the Standard Webhooks
specification) to endpoints tenants and the operator register, and email
alerts to a tenant's owners and admins. An event is written once, in the
transaction of what caused it (an outbox); each endpoint's delivery is a
Celery task retried with exponential backoff, every attempt logged."""
