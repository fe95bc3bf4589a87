"""Recording runs of other trainers into the tokengrad run format.

    from tokengrad.integrations.trl import attach     # TRL GRPOTrainer (needs the `trl` extra)

Each integration module imports its trainer library only when used, so importing this package never
pulls in an optional dependency.
"""
