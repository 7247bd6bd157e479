]
      recs:
        http: { backend: recs, path: 