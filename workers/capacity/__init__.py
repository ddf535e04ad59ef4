"""The capacity agent: what the platform says about one replica's machine, as contract events.

``decide`` is the pure part (metadata documents and hook calls in, ``PreemptionNotice`` out);
``imds`` reads the EC2 instance metadata service, ``agent`` polls it and sends the notices
through the one Kafka client module.
"""
