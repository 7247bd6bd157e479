
  - path: /users
    method: POST
    flow:
      created:
        sql:
          backend: db
          mode: exec
          query: "INSERT INTO users (id, name, email, created) VALUES ($1, $2, $3, now()) RETURNING id"
          params: [