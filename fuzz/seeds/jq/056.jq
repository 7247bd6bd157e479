]
        on_status: { 409: { status: 409, code: user_exists, message: "a user with this id or email exists" } }
    respond:
      status: 201
      body: 