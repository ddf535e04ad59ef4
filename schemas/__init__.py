"""The contract between Surplus components: event structs, strict codecs, topic catalog."""
