 }
        optional: true
        default: []
    respond:
      body: 