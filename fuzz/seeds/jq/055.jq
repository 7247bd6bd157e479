]
        on_status: { 404: { status: 404, code: user_not_found, message: "no such user" } }
      orders:
        sql:
          backend: db
          query: "SELECT id, total, tags FROM orders WHERE user_id = $1 ORDER BY id"
          params: [