# not a test dir: must be shipped
