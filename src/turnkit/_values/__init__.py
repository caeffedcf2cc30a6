"""Value types: messages, events, inbound events, input requests, policies, turn records.

Plain frozen data with their wire forms; they import nothing of turnkit but its errors.
"""
