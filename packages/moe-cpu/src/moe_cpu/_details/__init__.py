"""Private helpers of moe-cpu: token dispatch and weight conversions. Not a public API."""
