
    respond: { body: 