"""The scaled usage path, switched on by USAGE_LOG_URL (settings.USAGE_LOG):

    gateway spool -> NATS JetStream (a replicated stream, partitioned
    subjects, Nats-Msg-Id dedup)             [publisher: the gateway's sink]
      -> ledger writers (durable leases on partitions)            [writer]
      -> raw events: a Delta Lake table of Parquet files by hour   [store]

Without the setting, the gateway writes into the PostgreSQL ledger as it
always has (metering.sink)."""
