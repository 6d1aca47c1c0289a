def get_user(users, user_id):
    if user_id in users:
        return users[user_id]
    else:
        return None
